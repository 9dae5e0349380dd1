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
def test_energy_matches_a_loop_over_tiles(impl, heads: tuple[int, int], head_dim: int) -> None:
    pool, layout, locs, q = _case(heads, head_dim)
    k_mean = pool_keys(pool.k, key_segments(layout, locs))
    got = impl(q, k_mean, layout, 0.5)
    num_kv_heads = k_mean.shape[1]
    group = q.shape[1] // num_kv_heads
    for r in range(layout.num_rows):
        start, length = int(layout.row_q_start[r]), int(layout.row_q_len[r])
        diag, offset = int(layout.row_block[r]), int(layout.req_key_offset[layout.row_req[r]])
        for h in range(num_kv_heads):
            want = torch.zeros(layout.max_key_blocks)
            if diag:
                tile = q[start : start + length, h * group : (h + 1) * group].reshape(-1, q.shape[-1])
                s = 0.5 * tile @ k_mean[offset : offset + diag, h].T
                want[:diag] = torch.exp(s - s.max()).sum(0)
            torch.testing.assert_close(got[h, r], want, atol=1e-5, rtol=1e-5)


def test_energy_selection_keeps_the_best_block_and_all_at_alpha_zero() -> None:
    pool, layout, locs, q = _case()
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK, scorer="energy", alpha=0.0), None)
    sparse.begin(layout, locs)
    assert sparse.density(sparse.select(q, pool.k, 0.5)) == 1.0
    settings = SparseSettings(
        block_size=BLOCK, scorer="energy", alpha=1.0, local_blocks=0, sink_blocks=0, last_blocks=0
    )
    energy = block_energy(q, pool_keys(pool.k, key_segments(layout, locs)), layout, 0.5)
    kept = select_by_energy(energy, layout, settings)
    cols = torch.arange(layout.max_key_blocks)
    for h in range(energy.shape[0]):
        for r in range(layout.num_rows):
            diag = int(layout.row_block[r])
            scored = kept[h, r] & (cols < diag)
            assert int(scored.sum()) == (1 if diag else 0)
            if diag:
                assert scored[energy[h, r].argmax()]
