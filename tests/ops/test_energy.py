"""The block energy scorer against a per-tile loop, and what it keeps."""

from __future__ import annotations

import pytest
import torch
from kvpool import make_pool

from sglang_prefill_ext.ops import BlockLayout, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.energy import (
    block_energy,
    block_energy_reference,
    block_energy_triton,
    select_by_energy,
)
from sglang_prefill_ext.ops.layout import context_locs
from sglang_prefill_ext.ops.pooling import key_segments, pool_keys

BLOCK = 16
PREFIX, EXTEND = [40, 0], [100, 77]


def _case(heads: tuple[int, int] = (6, 2), head_dim: int = 16):
    pool = make_pool(
        [p + n for p, n in zip(PREFIX, EXTEND, strict=True)], 4, heads[1], head_dim, torch.float32
    )
    layout = BlockLayout.build(PREFIX, EXTEND, BLOCK)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = 2.0 * torch.randn(layout.num_tokens, heads[0], head_dim, generator=torch.Generator().manual_seed(1))
    return pool, layout, locs, q


@pytest.mark.parametrize("impl", [block_energy_reference, block_energy_triton])
@pytest.mark.parametrize(("heads", "head_dim"), [((6, 2), 16), ((8, 8), 32)])
@pytest.mark.parametrize("per_head", [False, True])
def test_energy_matches_a_loop_over_tiles(
    impl, heads: tuple[int, int], head_dim: int, per_head: bool
) -> None:
    pool, layout, locs, q = _case(heads, head_dim)
    k_mean = pool_keys(pool.k, key_segments(layout, locs))
    tile_heads = 1 if per_head else heads[0] // heads[1]
    got = impl(q, k_mean, layout, 0.5, tile_heads)
    for r in range(layout.num_rows):
        start, length = int(layout.row_q_start[r]), int(layout.row_q_len[r])
        diag, offset = int(layout.row_block[r]), int(layout.req_key_offset[layout.row_req[r]])
        for tile in range(heads[0] // tile_heads):
            want = torch.zeros(layout.max_key_blocks)
            if diag:
                first = tile * tile_heads
                rows = q[start : start + length, first : first + tile_heads].reshape(-1, head_dim)
                kv_head = first // (heads[0] // heads[1])
                s = 0.5 * rows @ k_mean[offset : offset + diag, kv_head].T
                want[:diag] = torch.exp(s - s.max()).sum(0)
            torch.testing.assert_close(got[tile, r], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scorer", ["energy", "head-energy"])
def test_energy_selection_keeps_each_tiles_best_block_and_all_at_alpha_zero(scorer: str) -> None:
    pool, layout, locs, q = _case()
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK, scorer=scorer, alpha=0.0), None)
    sparse.begin(layout, locs)
    assert sparse.density(sparse.select(q, pool.k, 0.5)) == 1.0
    settings = SparseSettings(
        block_size=BLOCK, scorer=scorer, alpha=1.0, local_blocks=0, sink_blocks=0, last_blocks=0
    )
    tile_heads = 1 if scorer == "head-energy" else 3
    energy = block_energy(q, pool_keys(pool.k, key_segments(layout, locs)), layout, 0.5, tile_heads)
    kept = select_by_energy(energy, 2, layout, settings)
    tiles_per_kv_head = energy.shape[0] // 2
    cols = torch.arange(layout.max_key_blocks)
    for r in range(layout.num_rows):
        diag = int(layout.row_block[r])
        for h in range(2):
            scored = kept[h, r] & (cols < diag)
            tiles = energy[h * tiles_per_kv_head : (h + 1) * tiles_per_kv_head, r]
            best = set(tiles.argmax(-1).tolist()) if diag else set()
            assert set(scored.nonzero().flatten().tolist()) == best
