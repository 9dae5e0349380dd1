"""Tiny random decoders for CPU tests (no download): SmolLM2's architecture (Llama) and Qwen2.5's (Qwen2:
biased Q/K/V), with grouped KV heads, in float32."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 256


def tiny(model_type: str = "llama", seed: int = 0, **config: Any) -> Any:
    """A random `model_type` decoder, seeded; `config` overrides the fields below (blend's defaults: 4
    layers, attention far from uniform, so blending visibly differs from prefill)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[model_type]
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        initializer_range=0.1,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return model_cls(config_cls(**(fields | config))).eval()
