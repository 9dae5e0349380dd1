"""Qwen2.5-Coder-0.5B-Instruct as scripts/models/model_parts.py brings it (issue 37, item 5), on the CPU: the
GGUF's header and SHA-256, the converted checkpoint against a second reading of the GGUF, a greedy code answer,
and the tokenizer building the RULER-style suite's cases. Skipped without the files, which `fetch` + `convert`
(or bench/gpu/run_real.sh REAL_MODEL=qwen-coder-0.5b) leave at the paths below (QWEN05B_GGUF, QWEN05B_HF)."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

GGUF = Path(
    os.environ.get("QWEN05B_GGUF", "/tmp/qwen-coder-0.5b-gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
)
HF = Path(os.environ.get("QWEN05B_HF", "/tmp/qwen-coder-0.5b-hf"))
needs_gguf = pytest.mark.skipif(
    not GGUF.is_file(), reason=f"no {GGUF} (model_parts.py fetch --model qwen-coder-0.5b)"
)
needs_hf = pytest.mark.skipif(
    not (HF / "model.safetensors").is_file(), reason=f"no {HF} (model_parts.py convert of the GGUF)"
)

# GGUF tensor names -> the checkpoint's (qwen2: no q/k permutation, biases on q, k, v)
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
TOP["output.weight"] = "lm_head.weight"
BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
Q8_0 = 8  # ggml type: blocks of 32 int8 weights behind one float16 scale


def checkpoint_name(gguf_name: str) -> str:
    if gguf_name in TOP:
        return TOP[gguf_name]
    _, layer, part, kind = gguf_name.split(".")
    return f"model.layers.{layer}.{BLOCK[part]}.{kind}"


def q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """Q8_0 bytes read by hand (34-byte blocks: float16 scale, 32 int8), not by the gguf package."""
    blocks = raw.reshape(-1, 34)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    weights = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return torch.from_numpy((scale * weights).reshape(shape))


@needs_gguf
def test_the_gguf_header_says_the_issue_s_shape_and_the_sha256_is_recorded(model_parts: ModuleType) -> None:
    assert model_parts.gguf_shape(GGUF) == model_parts.GGUFShape("qwen2", 24, 14, 2, 64, 32768, "Q4_K_M")
    meta = model_parts.gguf_metadata(GGUF)
    assert meta["general.basename"] == "Qwen2.5-Coder" and meta["general.size_label"] == "0.5B"
    assert model_parts.sha256(GGUF) == model_parts.SLICED["qwen-coder-0.5b"].sha256


@needs_gguf
@needs_hf
def test_the_checkpoint_is_the_gguf_dequantized() -> None:
    """Every tensor the gguf package dequantizes equals the checkpoint's after bf16 rounding, by name and shape;
    the Q8_0 lm_head (its own: this GGUF does not tie it to the Q5_0 embedding) also read by hand."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize
    from safetensors import safe_open

    reader = gguf.GGUFReader(GGUF)
    with safe_open(HF / "model.safetensors", "pt") as saved:
        names = set(saved.keys())
        seen = set()
        for tensor in reader.tensors:
            name = checkpoint_name(tensor.name)
            shape = tuple(reversed(tensor.shape.tolist()))
            dequantized = np.array(dequantize(tensor.data, tensor.tensor_type)).reshape(shape)
            ours = saved.get_tensor(name)
            assert ours.dtype == torch.bfloat16 and tuple(ours.shape) == shape, name
            assert torch.equal(ours, torch.from_numpy(dequantized).to(torch.bfloat16)), name
            if tensor.tensor_type == Q8_0:
                assert torch.equal(ours, q8_0(np.array(tensor.data), shape).to(torch.bfloat16)), name
            seen.add(name)
        assert seen == names and len(seen) == 24 * 12 + 3
    output = next(t for t in reader.tensors if t.name == "output.weight")
    assert output.tensor_type == Q8_0


@needs_hf
def test_the_config_says_the_gguf_shape_with_an_untied_head() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(HF)
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (24, 14, 2)
    assert config.hidden_size // config.num_attention_heads == 64
    assert config.max_position_embeddings == 32768 and config.tie_word_embeddings is False
    assert config.eos_token_id == 151645  # <|im_end|>, where a chat answer stops


@needs_hf
def test_a_greedy_answer_to_a_code_prompt_is_the_function() -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(HF)
    model = transformers.AutoModelForCausalLM.from_pretrained(HF, dtype=torch.float32).eval()
    messages = [
        {"role": "user", "content": "Write a Python function is_prime(n) that returns True when n is prime."}
    ]
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "def is_prime(n" in answer, answer


@needs_hf
def test_the_tokenizer_builds_the_suite_s_cases() -> None:
    """bench.accuracy.ruler's path: AutoTokenizer on the folder, Qwen2.5's special ids, one held-out case per
    corpus whose prompts fit the length and carry every answer, each needle after a token ending a line."""
    transformers = pytest.importorskip("transformers")
    from bench.accuracy import ruler, tasks

    tokenizer = transformers.AutoTokenizer.from_pretrained(HF)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        151643,
        151644,
        151645,
    ]
    cases = ruler.cases_of("heldout", [4096], 2, 0, tokenizer)
    assert [fields["corpus"] for fields, _ in cases] == ["package-code", "prose"]
    for _, case in cases:
        assert len(case.questions) == len(tasks.FAMILIES) + tasks.SINGLE_KEYS + tasks.MULTIKEY_KEYS - 2
        for question, prompt in zip(case.questions, case.prompts, strict=True):
            assert len(prompt) <= 4096
            text = tokenizer.decode(prompt)
            assert text.endswith(question.text) and all(answer in text for answer in question.answers)
        for needle, at in case.needle_at:
            assert at == 0 or tokenizer.decode(case.context[at - 1 : at]).endswith("\n")
            assert tokenizer.decode(case.context[at:]).startswith(needle)
