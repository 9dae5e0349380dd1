"""Tiny random decoders of the two architectures blend.prefill runs: SmolLM2's (Llama) and Qwen2.5's
(Qwen2: biased Q/K/V), with grouped KV heads, in float32 on the CPU."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 256


def tiny(model_type: str, seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[model_type]
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        initializer_range=0.1,  # attention far from uniform, so blending visibly differs from prefill
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return model_cls(config).eval()
