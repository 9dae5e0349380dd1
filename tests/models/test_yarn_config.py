"""The YaRN view of a SmolLM2 checkpoint (scripts/models/model_parts.py yarn): the config
transformers reads for long-context accuracy runs, the weights shared with the original."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

# SmolLM2-135M-Instruct's config as `convert` saves it (the fields YaRN touches, and the shape).
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    "vocab_size": 49152,
}


@pytest.mark.parametrize(("factor", "positions"), [(4, 32768), (8, 65536), (16, 131072)])
def test_yarn_view_extends_rope_and_links_the_weights(
    model_parts: ModuleType, tmp_path: Path, factor: int, positions: int
) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(SMOLLM2))
    (src / "model.safetensors").write_bytes(b"weights")
    out = tmp_path / f"yarn{factor}"
    assert (
        model_parts.main(["yarn", "--model-dir", str(src), "--factor", str(factor), "--out", str(out)]) == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"] == {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": 8192,
        "rope_theta": 100000.0,
    }
    assert config["max_position_embeddings"] == positions
    assert (out / "model.safetensors").resolve() == (src / "model.safetensors").resolve()
    assert json.loads((src / "config.json").read_text()) == SMOLLM2  # the original is untouched


def test_transformers_reads_the_yarn_rope(model_parts: ModuleType) -> None:
    """transformers (the version SGLang pins) turns the extended config into YaRN's inverse frequencies."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(**model_parts.yarn_config(SMOLLM2, 8.0))
    assert config.rope_parameters["rope_type"] == "yarn"
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    head_dim = 576 // 9
    default_freq = 100000.0 ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    assert inv_freq.shape == default_freq.shape == (head_dim // 2,)
    assert attention_factor > 1.0  # YaRN's attention temperature
    # high frequencies kept, low ones interpolated by up to the factor
    ratio = inv_freq.double() / default_freq
    assert abs(float(ratio[0]) - 1.0) < 1e-5 and abs(float(ratio[-1]) - 1 / 8) < 1e-5


def test_default_parts_fit_one_device_call_beside_the_tracked_tree(
    model_parts: ModuleType, tmp_path: Path
) -> None:
    """split's default part size: 64 MiB less the repo's tracked files and the margin; the parts rejoin."""
    repo = Path(model_parts.__file__).parents[2]
    size = model_parts.part_mib(repo)
    assert 0 < size < model_parts.CALL_MIB - model_parts.MARGIN_MIB
    src = tmp_path / "blob.bin"
    src.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    assert model_parts.main(["split", str(src), "--parts-dir", str(tmp_path / "p"), "--max-mib", "0.3"]) == 0
    parts = sorted((tmp_path / "p").glob("p*/blob.bin.part*"))
    assert len(parts) == 4 and b"".join(p.read_bytes() for p in parts) == src.read_bytes()
