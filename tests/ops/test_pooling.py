"""Block pooling: the Triton kernel against the torch reference."""

from __future__ import annotations

import torch
from kvpool import make_pool

from sglang_prefill_ext.ops.layout import BlockLayout, context_locs
from sglang_prefill_ext.ops.scorers.pooled import (
    key_segments,
    pool_queries,
    query_segments,
    segment_mean_torch,
    segment_mean_triton,
)


def _batch(block: int = 16):
    prefix, extend = [0, 37, 64], [50, 29, 40]
    pool = make_pool([p + n for p, n in zip(prefix, extend, strict=True)], 4, 2, 32)
    layout = BlockLayout.build(prefix, extend, block)
    return pool, layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices)


def test_query_means_match_reference_and_plain_mean() -> None:
    _, layout, _ = _batch()
    q = torch.randn(layout.num_tokens, 8, 32).bfloat16()
    got = pool_queries(q, layout)
    ref = segment_mean_torch(q, query_segments(layout))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    r = 4
    start, length = int(layout.row_q_start[r]), int(layout.row_q_len[r])
    torch.testing.assert_close(got[r], q[start : start + length].float().mean(0), rtol=1e-5, atol=1e-6)


def test_key_means_gather_through_kv_slots() -> None:
    pool, layout, locs = _batch()
    got = segment_mean_triton(pool.k, key_segments(layout, locs))
    ref = segment_mean_torch(pool.k, key_segments(layout, locs))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    b, block = 2, 3
    key = int(layout.req_key_offset[b]) + block
    want = pool.k[locs[layout.key_tok_start[key] : layout.key_tok_start[key] + 16]].float().mean(0)
    torch.testing.assert_close(got[key], want, rtol=1e-5, atol=1e-6)
