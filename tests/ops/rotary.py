"""Test helpers: keys rotated as SGLang's own rotary embedding rotates them, for ops/rerotate.py.

SGLang's `RotaryEmbedding` / `YaRNScalingRotaryEmbedding` cannot be built on a machine without its
CPU or CUDA kernels, so their table methods run on a stand-in holding the fields they read (the
plain table's inverse frequencies read the server's exec config: a default one is given). The keys
are rotated by SGLang's `apply_rotary_emb`, neox layout, from that float32 cos/sin table: what
`forward_native` computes, and the table `forward_cuda` reads.
"""

from __future__ import annotations

import types
from unittest import mock

import torch

from sglang_prefill_ext.ops.rope import Rope, Yarn

# Qwen2.5-Coder-1.5B: 2 KV heads of 128, rope_theta 1e6, 32768 positions; its long-context YaRN
# rope_scaling (factor 4 over the original 32768).
HEAD_DIM, KV_HEADS, BASE, POSITIONS = 128, 2, 1e6, 32768
PLAIN = Rope(HEAD_DIM, BASE)
YARN = Rope(HEAD_DIM, BASE, Yarn(factor=4.0, original_max_position_embeddings=POSITIONS))
# A bf16 key re-rotated carries two roundings per pair (cached at p, written at q), each within 2^-8
# of the pair's norm (2^-7 where Triton's interpreter truncates); the rotation adds none of its own.
BF16_TOLERANCE = 2.0**-6


def sglang_rope(rope: Rope) -> types.SimpleNamespace:
    """The fields SGLang's rotary classes read, for `rope`; `inv_freq` and `cos_sin` (its table) set."""
    from sglang.srt.layers.rotary_embedding import base
    from sglang.srt.layers.rotary_embedding.yarn import YaRNScalingRotaryEmbedding, yarn_get_mscale_simple

    fields = types.SimpleNamespace(  # _force_native, position_start: read by 0.5.23 (its defaults)
        base=rope.base,
        rotary_dim=rope.head_dim,
        max_position_embeddings=POSITIONS,
        _force_native=False,
        position_start=0,
    )
    if rope.yarn is None:
        exec_config = types.SimpleNamespace(deterministic=types.SimpleNamespace(rl_on_policy_target=None))
        with mock.patch.object(base, "get_exec", return_value=exec_config):
            fields.inv_freq = base.RotaryEmbedding._compute_inv_freq(fields, rope.base)
        fields._compute_inv_freq = lambda _: fields.inv_freq
        fields.cos_sin = base.RotaryEmbedding._compute_cos_sin_cache(fields)
        return fields
    yarn = rope.yarn
    fields.max_position_embeddings = yarn.original_max_position_embeddings
    fields.scaling_factor = yarn.factor
    fields.beta_fast, fields.beta_slow = yarn.beta_fast, yarn.beta_slow
    fields.extrapolation_factor, fields.truncate = yarn.extrapolation_factor, yarn.truncate
    fields.mscale = yarn_get_mscale_simple(yarn.factor)
    fields.inv_freq = YaRNScalingRotaryEmbedding._compute_inv_freq(fields, yarn.factor)
    fields._compute_inv_freq = lambda _: fields.inv_freq
    fields.cos_sin = YaRNScalingRotaryEmbedding._compute_cos_sin_cache(fields)
    return fields


def rotated(k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Float32 `k` [tokens, heads, D] rotated for `positions` by SGLang's table `cos_sin`."""
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    cos, sin = cos_sin.to(k.device)[positions].chunk(2, dim=-1)
    return apply_rotary_emb(k, cos, sin, True)


def pair_norms(k: torch.Tensor) -> torch.Tensor:
    """Each rotated pair's norm, [tokens, heads, D / 2]: what a rotation keeps."""
    x1, x2 = k.float().chunk(2, dim=-1)
    return torch.hypot(x1, x2)


def max_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest error of a rotated pair, relative to that pair's norm."""
    x1, x2 = (got.float() - want.float()).chunk(2, dim=-1)
    return float((torch.hypot(x1, x2) / pair_norms(want).clamp_min(1e-30)).max())
