"""Chunk-offset mapping: rows of a chunk at offset P, key blocks over prefix + chunk."""

from __future__ import annotations

import pytest
import torch
from kvpool import make_pool

from sglang_prefill_ext.ops.layout import BlockLayout, context_locs

CASES = [
    ([0], [300], 64),
    ([37], [29], 16),
    ([0, 37, 64, 128], [50, 29, 40, 1], 16),
    ([1000, 5], [3, 700], 128),
]


@pytest.mark.parametrize(("prefix", "extend", "block"), CASES)
def test_rows_cover_each_new_token_once_in_its_absolute_block(
    prefix: list[int], extend: list[int], block: int
) -> None:
    layout = BlockLayout.build(prefix, extend, block)
    starts, lens = layout.row_q_start.long(), layout.row_q_len.long()
    assert layout.num_tokens == sum(extend)
    assert torch.equal(starts, layout.row_q_start_host.long())
    assert (
        starts[0] == 0
        and torch.equal(starts[1:], (starts + lens)[:-1])
        and int(starts[-1] + lens[-1]) == sum(extend)
    )
    token_offset = 0
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        rows = (layout.row_req == b).nonzero().flatten()
        positions = torch.arange(p, p + n)
        token_row = torch.repeat_interleave(rows, lens[rows])
        assert torch.equal(layout.row_block[token_row].long(), positions // block)
        assert int(starts[rows[0]]) == token_offset
        token_offset += n


@pytest.mark.parametrize(("prefix", "extend", "block"), CASES)
def test_key_blocks_span_prefix_and_chunk(prefix: list[int], extend: list[int], block: int) -> None:
    layout = BlockLayout.build(prefix, extend, block)
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        off, num = int(layout.req_key_offset[b]), int(layout.req_num_key_blocks[b])
        assert num == -(-(p + n) // block) and int(layout.req_ctx_len[b]) == p + n
        lens = layout.key_len[off : off + num].long()
        assert int(lens.sum()) == p + n and bool((lens[:-1] == block).all())
        starts = layout.key_tok_start[off : off + num] - layout.req_ctx_offset[b]
        assert torch.equal(starts, torch.arange(num) * block)


def test_context_locs_follow_req_to_token() -> None:
    prefix, extend = [5, 0, 70], [20, 9, 3]
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, page_size=16, num_kv_heads=1, head_dim=16)
    layout = BlockLayout.build(prefix, extend, 16)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    want = torch.cat([pool.req_to_token[pool.req_pool_indices[b], :n].long() for b, n in enumerate(ctx)])
    assert torch.equal(locs, want)


def test_rejects_empty_extend() -> None:
    with pytest.raises(ValueError):
        BlockLayout.build([3], [0], 16)
