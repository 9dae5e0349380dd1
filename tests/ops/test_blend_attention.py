"""Blended attention on the CPU: queries at scattered positions, causal over the whole prompt's KV;
the SDPA path against the float32 reference, and the reference against plain causal attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_prefill_ext.ops import blend_attention as ba


def _inputs(keys: int, queries: int, heads: int = 6, kv_heads: int = 2, dim: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(keys, kv_heads, dim, generator=gen)
    v = torch.randn(keys, kv_heads, dim, generator=gen)
    q_pos = torch.randperm(keys, generator=gen)[:queries].sort().values
    q = torch.randn(queries, heads, dim, generator=gen)
    return q, k, v, q_pos


def test_the_reference_at_every_position_is_causal_attention() -> None:
    q, k, v, _ = _inputs(40, 40)
    causal = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(3, 1).transpose(0, 1), v.repeat_interleave(3, 1).transpose(0, 1),
        is_causal=True, scale=0.2,
    ).transpose(0, 1)  # fmt: skip
    torch.testing.assert_close(
        ba.blend_attention_fp32(q, k, v, torch.arange(40), 0.2), causal, rtol=1e-5, atol=1e-5
    )


def test_a_query_sees_no_key_past_its_position() -> None:
    q, k, v, q_pos = _inputs(64, 12)
    later = torch.arange(64)[:, None, None] > q_pos[5]
    noisy_k, noisy_v = k + 10 * later, v - 10 * later
    for attend in (ba.blend_attention_fp32, ba.blend_attention):
        assert torch.equal(attend(q, k, v, q_pos, 0.2)[5], attend(q, noisy_k, noisy_v, q_pos, 0.2)[5])


def test_the_sdpa_path_is_the_reference_across_query_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ba, "QUERY_BLOCK", 7)
    q, k, v, q_pos = _inputs(300, 45)
    torch.testing.assert_close(
        ba.blend_attention(q, k, v, q_pos, 0.17),
        ba.blend_attention_fp32(q, k, v, q_pos, 0.17),
        rtol=1e-5,
        atol=1e-5,
    )


def test_no_queries_give_an_empty_output() -> None:
    q, k, v, _ = _inputs(10, 0)
    assert ba.blend_attention(q, k, v, torch.zeros(0, dtype=torch.long), 0.2).shape == (0, 6, 32)


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "pos_len", "message"),
    [
        ((4, 6, 32), (10, 4, 32), 4, "do not group"),
        ((4, 6, 32), (10, 2, 16), 4, "expected"),
        ((4, 6, 32), (10, 2, 32), 3, "q_pos"),
    ],
)
def test_malformed_shapes_are_refused(q_shape, kv_shape, pos_len, message) -> None:
    k = torch.zeros(kv_shape)
    with pytest.raises(ValueError, match=message):
        ba.blend_attention(torch.zeros(q_shape), k, k, torch.zeros(pos_len, dtype=torch.long), 0.1)
