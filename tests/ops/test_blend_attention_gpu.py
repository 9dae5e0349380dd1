"""On the GPU: blended attention in bf16 (the SDPA path) against the float32 reference, at
Qwen2.5-Coder-1.5B's head shape (12 query / 2 KV heads, head_dim 128): 8 chunks of 2K reused tokens,
15 % of each chunk's tokens recomputed at scattered positions, and a 512-token question after them."""

from __future__ import annotations

import pytest
import torch

from sglang_prefill_ext.ops.blend_attention import blend_attention, blend_attention_fp32

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def test_bf16_blended_attention_is_the_fp32_reference_within_bf16_rounding() -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    chunks, chunk, question = 8, 2048, 512
    keys = chunks * chunk + question
    k = torch.randn(keys, 2, 128, device=DEVICE, generator=gen)
    v = torch.randn(keys, 2, 128, device=DEVICE, generator=gen)
    picked = torch.rand(keys - question, device=DEVICE, generator=gen) < 0.15
    q_pos = torch.cat((picked.nonzero()[:, 0], torch.arange(keys - question, keys, device=DEVICE)))
    q = torch.randn(len(q_pos), 12, 128, device=DEVICE, generator=gen)
    scale = 128**-0.5
    reference = blend_attention_fp32(q, k, v, q_pos, scale)
    got = blend_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), q_pos, scale)
    assert got.dtype == torch.bfloat16
    error = (got.float() - reference).abs()
    # The floor: the exact attention of the bf16-rounded inputs (on the CPU at a quarter of this size,
    # SDPA's error was 1.5x the floor's at the max and 1.1x at the mean).
    rounded = (x.bfloat16().float() for x in (q, k, v))
    floor = (blend_attention_fp32(*rounded, q_pos, scale) - reference).abs()
    assert float(error.max()) < 3 * float(floor.max()) and float(error.mean()) < 3 * float(floor.mean())
    unmasked = blend_attention_fp32(q, k, v, torch.full_like(q_pos, keys - 1), scale)
    assert float((unmasked - reference).abs().mean()) > 30 * float(error.mean())
