"""Sampled-row block mass: Triton kernel vs the dense torch reference, coverage selection, needles."""

from __future__ import annotations

import pytest
import torch
from kvpool import scattered_batch

from sglang_prefill_ext.ops.layout import BlockLayout
from sglang_prefill_ext.ops.scorers.sampled import (
    block_mass_torch,
    block_mass_triton,
    row_tiles,
    sample_offsets,
)
from sglang_prefill_ext.ops.selection import select_by_mass, structural_blocks
from sglang_prefill_ext.ops.settings import SparseSettings

BLOCK = 16


def _batch(heads: tuple[int, int], head_dim: int, prefix: list[int], extend: list[int], seed: int = 0):
    return scattered_batch(heads, head_dim, prefix, extend, BLOCK, seed)


@pytest.mark.parametrize(("heads", "head_dim"), [((8, 2), 32), ((9, 3), 64), ((4, 4), 16)])
@pytest.mark.parametrize("samples", [1, 3])
@pytest.mark.parametrize("chunk_cols", [32, 3])
def test_triton_mass_matches_torch(
    heads: tuple[int, int], head_dim: int, samples: int, chunk_cols: int
) -> None:
    """Also with key-block chunks that end inside the rows' unmasked and diagonal ranges."""
    layout, q, k_buffer, locs = _batch(heads, head_dim, [0, 37, 200, 5], [90, 29, 40, 3])
    got = block_mass_triton(q, k_buffer, locs, layout, samples, head_dim**-0.5, chunk_cols=chunk_cols)
    want = block_mass_torch(q, k_buffer, locs, layout, samples, head_dim**-0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    per_q = block_mass_triton(
        q, k_buffer, locs, layout, samples, head_dim**-0.5, chunk_cols=chunk_cols, per_query_head=True
    )
    torch.testing.assert_close(
        per_q, block_mass_torch(q, k_buffer, locs, layout, samples, head_dim**-0.5, per_query_head=True),
        atol=2e-5, rtol=1e-4,
    )  # fmt: skip
    # a KV head's mass is the mean of its query heads'
    torch.testing.assert_close(per_q.view(heads[1], -1, *per_q.shape[1:]).mean(1), got, atol=1e-6, rtol=1e-5)


def test_mass_rows_sum_to_one_and_vanish_after_the_diagonal() -> None:
    layout, q, k_buffer, locs = _batch((4, 2), 16, [50, 0], [60, 130])
    mass = block_mass_torch(q, k_buffer, locs, layout, 2, 0.25)
    torch.testing.assert_close(mass.sum(-1), torch.ones(2, layout.num_rows))
    after = torch.arange(layout.max_key_blocks)[None, :] > layout.row_block.long()[:, None]
    assert float(mass[:, after].abs().max()) == 0.0


def test_samples_start_at_the_last_query_and_stay_inside_short_rows() -> None:
    layout = BlockLayout.build([10], [40], BLOCK)  # row lengths 6, 16, 16, 2
    assert sample_offsets(layout, 3).tolist() == [[5, 3, 0], [15, 8, 0], [15, 8, 0], [1, 1, 0]]
    assert sample_offsets(layout, 1).tolist() == [[5], [15], [15], [1]]


def test_tiles_never_span_two_requests() -> None:
    layout = BlockLayout.build([0, 0, 0], [16 * 5, 16 * 2, 16 * 3], BLOCK)  # rows 0-4, 5-6, 7-9
    assert row_tiles(layout, 2).tolist() == [0, 2, 4, 5, 7, 9]


def test_coverage_keeps_the_fewest_largest_blocks() -> None:
    layout = BlockLayout.build([0], [16 * 6], BLOCK)
    settings = SparseSettings(block_size=BLOCK, mass=0.8, sink_blocks=0, local_blocks=0, last_blocks=0)
    mass = torch.zeros(1, layout.num_rows, 6)
    mass[0, 5] = torch.tensor([0.05, 0.5, 0.1, 0.25, 0.05, 0.05])
    keep = select_by_mass(mass, layout, settings)
    # 0.5 + 0.25 fall short of 0.8, the 0.1 reaches it; block 5 is the diagonal
    assert keep[0, 5].nonzero().flatten().tolist() == [1, 2, 3, 5]
    settings_all = SparseSettings(block_size=BLOCK, mass=1.0, sink_blocks=0, local_blocks=0, last_blocks=0)
    assert int(select_by_mass(mass, layout, settings_all)[0, 5].sum()) == 6


def test_structural_blocks_survive_zero_mass_and_nothing_acausal_is_kept() -> None:
    layout, q, k_buffer, locs = _batch((4, 2), 16, [16 * 3], [16 * 9])
    settings = SparseSettings(block_size=BLOCK, mass=0.0, sink_blocks=1, local_blocks=2, last_blocks=1)
    keep = select_by_mass(torch.zeros(2, layout.num_rows, layout.max_key_blocks), layout, settings)
    assert torch.equal(keep, structural_blocks(layout, settings, keep.device)[None].expand_as(keep))
    mass = block_mass_torch(q, k_buffer, locs, layout, 2, 0.25)
    keep = select_by_mass(mass, layout, SparseSettings(block_size=BLOCK, mass=1.0))
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    assert not bool((keep & ~causal[None]).any())


@pytest.mark.parametrize("impl", [block_mass_triton, block_mass_torch])
def test_a_needle_read_by_one_query_head_is_kept_for_its_kv_head(impl) -> None:
    """A single key (not a block) that one query head's rows seek: pooled means dilute it 1/16, the
    sampled rows see it whole."""
    layout, q, k_buffer, locs = _batch((8, 2), 32, [16 * 30], [16 * 10], seed=3)
    needle = torch.randn(32)
    needle = 6.0 * needle / needle.norm()
    row, key_block, q_head = 6, 11, 5  # query head 5 belongs to KV head 1
    start = int(layout.row_q_start[row])
    q[start : start + BLOCK, q_head] += needle
    k_buffer[locs[key_block * BLOCK + 9], 1] += needle
    mass = impl(q, k_buffer, locs, layout, 2, 32**-0.5)
    keep = select_by_mass(mass, layout, SparseSettings(block_size=BLOCK, mass=0.9, local_blocks=1))
    assert bool(keep[1, row, key_block])
    assert float(keep.float().mean()) < 0.9


def test_hybrid_keeps_the_union_of_both_scorers() -> None:
    from sglang_prefill_ext.ops.policy import SparsePrefill

    layout, q, k_buffer, locs = _batch((4, 2), 16, [16 * 2], [16 * 12], seed=5)
    masks = {}
    for scorer in ("hybrid", "sampled", "pooled"):
        sparse = SparsePrefill(SparseSettings(block_size=BLOCK, scorer=scorer, mass=0.5, threshold=0.5), None)
        sparse.begin(layout, locs)
        masks[scorer] = sparse.select(q, k_buffer, 0.25)
    assert torch.equal(masks["hybrid"], masks["sampled"] | masks["pooled"])
    assert not torch.equal(masks["sampled"], masks["pooled"])


def test_the_kernel_geometry_is_built_once_per_layout_and_shared_by_layers() -> None:
    from sglang_prefill_ext.ops.policy import SparsePrefill

    layout, q, k_buffer, locs = _batch((8, 2), 32, [16 * 3, 0], [16 * 7, 50], seed=2)
    sparse = SparsePrefill(
        SparseSettings(block_size=BLOCK, scorer="sampled", samples=2, per_query_head=False), None
    )
    sparse.begin(layout, locs)
    first = sparse.select(q, k_buffer, 0.2)
    geometry = sparse._geometry
    second = sparse.select(q * 0.5, k_buffer, 0.2)  # a later layer: same layout, other queries
    assert sparse._geometry is geometry
    want = select_by_mass(block_mass_torch(q * 0.5, k_buffer, locs, layout, 2, 0.2), layout, sparse.settings)
    assert torch.equal(second, want) and first.shape == second.shape
    sparse.begin(layout, locs)
    assert sparse._geometry is None
