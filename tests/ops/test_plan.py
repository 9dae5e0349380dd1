"""Mask -> FlashInfer indices, and what FlashInfer's causal paged prefill computes over them (emulated)."""

from __future__ import annotations

import pytest
import torch
from kvpool import causal_attention, emulate_paged_prefill, make_pool, request_kv, token_keep_mask

from sglang_prefill_ext.ops.attention import to_head_major, to_token_major
from sglang_prefill_ext.ops.layout import BlockLayout, context_locs
from sglang_prefill_ext.ops.plan import (
    BlockRuns,
    build_plan_indices,
    expand_blocks_reference,
    expand_blocks_triton,
)

BLOCK = 16


def _setup(prefix: list[int], extend: list[int], page: int, heads: tuple[int, int], seed: int = 0):
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, page, heads[1], 32, dtype=torch.float32, seed=seed)
    layout = BlockLayout.build(prefix, extend, BLOCK)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = torch.randn(layout.num_tokens, heads[0], 32, generator=torch.Generator().manual_seed(seed + 1))
    return pool, layout, locs, q


def _random_mask(layout: BlockLayout, num_kv_heads: int, density: float) -> torch.Tensor:
    cols = torch.arange(layout.max_key_blocks)[None, :]
    diag = layout.row_block.long()[:, None]
    keep = (torch.rand(num_kv_heads, layout.num_rows, layout.max_key_blocks) < density) | (cols == diag)
    return keep & (cols <= diag)


def test_expand_triton_matches_reference() -> None:
    _, layout, locs, _ = _setup([37, 0], [60, 45], 4, (4, 2))
    mask = _random_mask(layout, 2, 0.5)
    head, row, col = mask.nonzero(as_tuple=True)
    key = layout.req_key_offset[layout.row_req[row].long()].long() + col
    length = layout.key_len[key].long()
    dest = torch.cumsum(length, 0) - length
    runs = BlockRuns(locs, layout.key_tok_start[key], length, dest, head, 2, int(length.sum()), BLOCK)
    assert torch.equal(expand_blocks_triton(runs), expand_blocks_reference(runs))


def test_indices_list_kept_tokens_per_head_and_row_with_the_diagonal_last() -> None:
    pool, layout, locs, _ = _setup([37, 0], [60, 45], 4, (4, 2))
    mask = _random_mask(layout, 2, 0.4)
    indices = build_plan_indices(mask, layout, locs)
    n, rows = layout.num_tokens, layout.num_rows
    assert indices.num_segments == 2 * rows and int(indices.qo_indptr[-1]) == 2 * n
    for h in range(2):
        for r in range(rows):
            s = h * rows + r
            q_lo, q_hi = int(indices.qo_indptr[s]), int(indices.qo_indptr[s + 1])
            assert (q_lo - h * n, q_hi - q_lo) == (int(layout.row_q_start[r]), int(layout.row_q_len[r]))
            got = indices.kv_indices[int(indices.kv_indptr[s]) : int(indices.kv_indptr[s + 1])].long()
            b = int(layout.row_req[r])
            ctx_off = int(layout.req_ctx_offset[b])
            ctx = int(layout.req_ctx_len[b])
            positions = [p for p in range(ctx) if mask[h, r, p // BLOCK]]
            assert got.tolist() == [int(locs[ctx_off + p]) * 2 + h for p in positions]
            assert positions[-1] == min(ctx, (int(layout.row_block[r]) + 1) * BLOCK) - 1


def test_head_major_round_trip() -> None:
    q = torch.randn(10, 12, 8)
    hm = to_head_major(q, 3)
    assert torch.equal(hm[2 * 10 + 4], q[4, 8:12])
    assert torch.equal(to_token_major(hm, 3), q)


CHUNK_CASES = [([0], [100]), ([0, 0, 0], [33, 80, 16]), ([37, 0, 64], [29, 50, 40]), ([200], [1])]


@pytest.mark.parametrize(("prefix", "extend"), CHUNK_CASES)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads", [(8, 2), (7, 1)])
@pytest.mark.parametrize("density", [1.0, 0.3])
def test_emulated_sparse_prefill_equals_masked_dense_attention(
    prefix: list[int], extend: list[int], page: int, heads: tuple[int, int], density: float
) -> None:
    pool, layout, locs, q = _setup(prefix, extend, page, heads)
    mask = _random_mask(layout, heads[1], density)
    indices = build_plan_indices(mask, layout, locs)
    out = emulate_paged_prefill(to_head_major(q, heads[1]), pool.k, pool.v, indices)
    out = to_token_major(out, heads[1])
    group = heads[0] // heads[1]
    offset = 0
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        k, v = request_kv(pool, b, p + n)
        rows = (layout.row_req == b).nonzero().flatten()
        keep = token_keep_mask(mask[:, rows], layout.row_block[rows], torch.arange(p, p + n), p + n, BLOCK)
        want = causal_attention(q[offset : offset + n], k, v, keep.repeat_interleave(group, 1))
        torch.testing.assert_close(out[offset : offset + n], want, rtol=1e-4, atol=1e-4)
        offset += n
