"""bench/sparse_accuracy.py's fp32 emulation on a tiny random Llama (no download): the chunked exact
attention is SDPA, and keeping every block is dense."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
LENGTH, BLOCK = 300, 32


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the script imports its sibling real_text
    spec = importlib.util.spec_from_file_location("sparse_accuracy", BENCH / "sparse_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=96, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=LENGTH,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _logits(model, tokens: torch.Tensor, name: str, attention) -> torch.Tensor:
    from transformers import AttentionInterface

    if attention is not None:
        AttentionInterface.register(name, attention)
    model.set_attn_implementation(name)
    with torch.no_grad():
        return model(tokens).logits[0]


def test_chunked_exact_attention_equals_sdpa(bench: ModuleType, model) -> None:
    tokens = torch.randint(0, 128, (1, LENGTH))
    sdpa = _logits(model, tokens, "sdpa", None)
    exact = _logits(model, tokens, "test_exact", bench.exact_attention)
    torch.testing.assert_close(exact, sdpa, atol=1e-4, rtol=1e-4)


def test_every_block_kept_gives_dense_logits(bench: ModuleType, model) -> None:
    from sglang_prefill_ext.ops import SparsePrefill, SparseSettings

    tokens = torch.randint(0, 128, (1, LENGTH))
    dense = _logits(model, tokens, "test_exact", bench.exact_attention)
    settings = SparseSettings(block_size=BLOCK, scorer="pooled", threshold=0.0)
    attention = bench.SparseAttention(SparsePrefill(settings, None), 1, BLOCK, per_layer=True, emulate=True)
    sparse = _logits(model, tokens, "test_sparse", attention)
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)
    summary = bench.density_summary(attention.densities)
    assert summary["density"] == 1.0
    assert sorted(summary["density_per_head"]) == [1, 2, 3]
    assert all(heads == [1.0, 1.0] for heads in summary["density_per_head"].values())
