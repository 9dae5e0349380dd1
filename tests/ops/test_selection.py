"""Block selection: Triton kernel vs torch reference, the structural rules, planted needles, GQA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_prefill_ext.ops.layout import BlockLayout
from sglang_prefill_ext.ops.scorers.pooled import pooled_scores, select_pooled_torch, select_pooled_triton
from sglang_prefill_ext.ops.selection import (
    largest_holding,
    mass_fraction,
    select_by_mass,
    select_by_mass_torch,
    select_by_mass_triton,
    structural_blocks,
)
from sglang_prefill_ext.ops.settings import SparseSettings

BLOCK = 16


def _pooled(heads: tuple[int, int], head_dim: int, prefix: list[int], extend: list[int], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    layout = BlockLayout.build(prefix, extend, BLOCK)
    qpool = torch.randn(layout.num_rows, heads[0], head_dim, generator=gen)
    kpool = torch.randn(layout.num_key_blocks, heads[1], head_dim, generator=gen)
    return layout, qpool, kpool


def _assert_same_up_to_ties(got: torch.Tensor, want: torch.Tensor, margin: torch.Tensor) -> None:
    """Masks agree except where a score sits within float rounding of the threshold."""
    differ = got != want
    assert bool((margin[differ] < 1e-4).all()), (
        f"{int(differ.sum())} decisions differ away from the threshold"
    )


@pytest.mark.parametrize(("heads", "head_dim"), [((8, 2), 64), ((7, 1), 32), ((4, 4), 128)])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("per_query_head", [False, True])
def test_triton_selection_matches_torch(
    heads: tuple[int, int], head_dim: int, threshold: float, per_query_head: bool
) -> None:
    layout, qpool, kpool = _pooled(heads, head_dim, [0, 37, 200], [90, 29, 40])
    settings = SparseSettings(
        block_size=BLOCK,
        threshold=threshold,
        sink_blocks=1,
        local_blocks=2,
        last_blocks=1,
        per_query_head=per_query_head,
    )
    got = select_pooled_triton(qpool, kpool, layout, settings, 0.3)
    want = select_pooled_torch(qpool, kpool, layout, settings, 0.3)
    assert got.shape[0] == (heads[0] if per_query_head else heads[1])
    s = pooled_scores(qpool, kpool, layout, 0.3)
    gap = (s - s.amax(-1, keepdim=True) - settings.log_threshold).abs()
    margin = gap if per_query_head else gap.view(heads[1], -1, *gap.shape[1:]).amin(1)
    _assert_same_up_to_ties(got, want, margin.nan_to_num(1.0))


def test_a_kv_heads_blocks_are_the_union_of_its_query_heads() -> None:
    """Per KV head, the pooled rule keeps a block when any query head of the group passes: exactly the
    union of the per-query-head masks."""
    heads = (8, 2)
    layout, qpool, kpool = _pooled(heads, 32, [0, 37], [90, 60])
    base = SparseSettings(
        block_size=BLOCK, threshold=0.2, sink_blocks=0, local_blocks=1, last_blocks=0, per_query_head=False
    )
    per_q = select_pooled_torch(qpool, kpool, layout, dataclasses.replace(base, per_query_head=True), 0.3)
    per_kv = select_pooled_torch(qpool, kpool, layout, base, 0.3)
    assert torch.equal(per_kv, per_q.view(heads[1], -1, *per_q.shape[1:]).any(1))
    assert int(per_q.sum()) < int(per_kv.repeat_interleave(4, 0).sum())


def test_threshold_zero_keeps_every_causal_block_and_nothing_after_the_diagonal() -> None:
    layout, qpool, kpool = _pooled((4, 2), 32, [40], [100])
    mask = select_pooled_torch(qpool, kpool, layout, SparseSettings(block_size=BLOCK, threshold=0.0), 1.0)
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    assert torch.equal(mask, causal[None].expand_as(mask))


def test_structural_blocks_are_kept_whatever_the_scores() -> None:
    layout, qpool, kpool = _pooled((4, 2), 32, [0], [16 * 20])
    settings = SparseSettings(block_size=BLOCK, threshold=1.0, sink_blocks=2, local_blocks=3, last_blocks=2)
    mask = select_pooled_triton(
        qpool, kpool * 0, layout, settings, 1.0
    )  # all scores tie: only the best passes
    for r in range(layout.num_rows):
        i = int(layout.row_block[r])
        kept = set(mask[0, r].nonzero().flatten().tolist())
        structural = {c for c in range(i + 1) if c < 2 or c > i - 3} if i < 18 else set(range(i + 1))
        assert structural <= kept
        assert max(kept) == i


@pytest.mark.parametrize("impl", [select_pooled_triton, select_pooled_torch])
def test_only_an_extend_that_ends_its_prompt_keeps_its_last_rows_dense(impl) -> None:
    """A chunk before the prompt's end is a stretch of text like any other: its last rows are selected
    as every row is, not kept dense over the whole prefix (one long segment: the attention's critical
    path)."""
    gen = torch.Generator().manual_seed(3)
    prefix, extend = [64, 64], [16 * 12, 16 * 12]
    settings = SparseSettings(block_size=BLOCK, threshold=0.9, sink_blocks=1, local_blocks=1, last_blocks=2)
    layout = BlockLayout.build(prefix, extend, BLOCK, prompt_lens=torch.tensor([256, 4096]))
    qpool = torch.randn(layout.num_rows, 4, 32, generator=gen)
    kpool = torch.randn(layout.num_key_blocks, 2, 32, generator=gen)
    mask = impl(qpool, kpool, layout, settings, 1.0)
    every = BlockLayout.build(prefix, extend, BLOCK)  # the default: every request ends its prompt
    want = impl(qpool, kpool, every, settings, 1.0)
    for b in range(2):
        rows = (layout.row_req == b).nonzero().flatten()
        for r in rows[-2:].tolist():
            causal = int(layout.row_block[r]) + 1
            assert bool(want[:, r, :causal].all())  # dense by default
            assert bool(mask[:, r, :causal].all()) == bool(layout.req_ends_prompt[b])
        assert torch.equal(mask[:, rows[:-2]], want[:, rows[:-2]])  # the other rows are untouched


def test_relative_threshold_keeps_exactly_the_blocks_near_the_best() -> None:
    layout = BlockLayout.build([0], [16 * 8], BLOCK)
    settings = SparseSettings(block_size=BLOCK, threshold=0.5, sink_blocks=0, local_blocks=0, last_blocks=0)
    qpool = torch.zeros(layout.num_rows, 1, 16)
    qpool[:, 0, 0] = 1.0
    kpool = torch.zeros(layout.num_key_blocks, 1, 16)
    kpool[:, 0, 0] = torch.tensor([3.0, 0.0, 2.5, 2.0, 0.0, 3.0, 0.0, 0.0])  # log(0.5) = -0.69
    mask = select_pooled_triton(qpool, kpool, layout, settings, 1.0)
    assert mask[0, 7].nonzero().flatten().tolist() == [0, 2, 5, 7]
    assert mask[0, 3].nonzero().flatten().tolist() == [0, 2, 3]


@pytest.mark.parametrize("impl", [select_pooled_triton, select_pooled_torch])
def test_needle_in_one_query_head_is_kept_for_its_kv_head(impl) -> None:
    layout, qpool, kpool = _pooled((8, 2), 64, [16 * 30], [16 * 10], seed=3)
    needle = torch.randn(64)
    needle = 4.0 * needle / needle.norm()
    row, key_block, q_head = 6, 11, 5  # query head 5 belongs to KV head 1
    qpool[row, q_head] += needle
    kpool[key_block, 1] += needle
    mask = impl(qpool, kpool, layout, SparseSettings(block_size=BLOCK), 64**-0.5)
    assert bool(mask[1, row, key_block])
    assert float(mask[:, :, : layout.max_key_blocks].float().mean()) < 0.9


def test_density_counts_kept_blocks_over_the_causal_ones() -> None:
    from sglang_prefill_ext.ops.policy import SparsePrefill

    layout, qpool, kpool = _pooled((4, 2), 32, [48, 0], [40, 70])
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK), attention=None)
    sparse.begin(layout, torch.arange(layout.num_context_tokens))
    keep_all = SparseSettings(block_size=BLOCK, threshold=0.0)
    sparse.mask = select_pooled_torch(qpool, kpool, layout, keep_all, 1.0)
    assert sparse.density() == pytest.approx(1.0)
    only_diagonal = torch.zeros_like(sparse.mask)
    only_diagonal[:, torch.arange(layout.num_rows), layout.row_block.long()] = True
    sparse.mask = only_diagonal
    # request 0: rows are blocks 3..5 (4 + 5 + 6 causal blocks), request 1: blocks 0..4 (1 + ... + 5)
    assert sparse.density() == pytest.approx(layout.num_rows / (15 + 15))


def test_a_layout_denser_than_the_limit_is_declined_before_planning() -> None:
    """select_and_plan returns False and plans nothing (no attention object is even needed) when the
    selection keeps more than max_density of the causal blocks; a looser limit goes on to plan."""
    from sglang_prefill_ext.ops.policy import SparsePrefill

    layout = BlockLayout.build([0], [8 * BLOCK], BLOCK)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(layout.num_tokens, 4, 32, generator=gen)
    k_pool = torch.randn(layout.num_context_tokens, 2, 32, generator=gen)
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK, scorer="pooled", threshold=0.0), attention=None)
    sparse.begin(layout, torch.arange(layout.num_context_tokens))
    assert not sparse.select_and_plan(q, k_pool, 32**-0.5, max_density=0.5)
    assert not sparse.planned
    assert sparse.density() == pytest.approx(1.0)
    with pytest.raises(AttributeError):  # past the limit it plans, here on a missing attention object
        sparse.select_and_plan(q, k_pool, 32**-0.5, max_density=1.0)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.8, 0.95, 0.999])
@pytest.mark.parametrize(("ends", "decay"), [(True, 0.0), (False, 0.0), (False, 0.1)])
def test_the_mass_selection_kernel_keeps_what_the_sort_keeps(
    fraction: float, ends: bool, decay: float
) -> None:
    """Random row masses (zero outside causal blocks, heavy-tailed like attention, some rows all zero): the
    bisected threshold keeps exactly the sort's fewest largest blocks; rows wider than 256 columns; with a
    decay, the long prompt (8x `mass_len`) holds a lower fraction than the short one."""
    prompt_lens = torch.tensor([16 * 300 + 40 + (0 if ends else 8000), 75])
    layout = BlockLayout.build([16 * 300, 5], [40, 70], BLOCK, prompt_lens=prompt_lens)
    gen = torch.Generator().manual_seed(int(fraction * 1000))
    mass = torch.randn(6, layout.num_rows, layout.max_key_blocks, generator=gen).exp() ** 3
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    mass = mass * causal[None]
    mass[2, 1] = 0.0
    mass /= mass.sum(-1, keepdim=True).clamp_min(1e-30)
    settings = SparseSettings(
        block_size=BLOCK,
        mass=fraction,
        mass_decay=decay,
        mass_len=1600,
        sink_blocks=1,
        local_blocks=2,
        last_blocks=2,
    )
    got = select_by_mass_triton(mass, layout, settings, mass_fraction(layout.req_prompt_len, settings))
    assert torch.equal(
        got, select_by_mass_torch(mass, layout, settings, mass_fraction(layout.req_prompt_len, settings))
    )
    assert layout.max_key_blocks > 256 and bool((got.sum(-1) > 0).all())


def test_the_mass_falls_per_doubling_of_the_prompt_beyond_mass_len() -> None:
    settings = SparseSettings(mass=0.8, mass_decay=0.05, mass_len=32768)
    lens = torch.tensor([100, 32768, 65536, 131072, 98304, 1 << 40])
    got = mass_fraction(lens, settings)
    assert got[:4].tolist() == pytest.approx([0.8, 0.8, 0.75, 0.7])
    assert 0.7 < float(got[4]) < 0.75 and float(got[5]) == 0.0
    assert mass_fraction(lens, dataclasses.replace(settings, mass_decay=0.0)).tolist() == pytest.approx(
        [0.8] * 6
    )
    with pytest.raises(ValueError, match="mass_decay"):
        SparseSettings(mass_decay=-0.1)


@pytest.mark.parametrize("decay", [0.0, 0.075, 0.3])
def test_the_per_request_mass_gives_the_masks_of_the_in_kernel_decay(decay: float) -> None:
    """The decay is computed once per request (`mass_fraction`) and read by both twins: the masks equal those of
    the rule the Triton kernel used to apply itself, max(mass - decay x max(log2(len / mass_len), 0), 0) in
    fp32 per row, over prompts shorter than, at, between and far past `mass_len`'s doublings."""
    prompt_lens = torch.tensor([100, 1600, 2400, 6400, 50000, 1 << 30])
    layout = BlockLayout.build([16 * 20] * 6, [40] * 6, BLOCK, prompt_lens=prompt_lens)
    settings = SparseSettings(block_size=BLOCK, mass=0.8, mass_decay=decay, mass_len=1600, last_blocks=0)
    gen = torch.Generator().manual_seed(7)
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    mass = torch.rand(4, layout.num_rows, layout.max_key_blocks, generator=gen) * causal[None]
    row_len = layout.req_prompt_len[layout.row_req.long()].float()
    doublings = torch.log2(row_len / torch.tensor(float(settings.mass_len))).clamp_min(0.0)
    in_kernel = (torch.tensor(settings.mass) - torch.tensor(decay) * doublings).clamp_min(0.0)
    want = largest_holding(mass, in_kernel[:, None]) | structural_blocks(layout, settings, mass.device)[None]
    fraction = mass_fraction(layout.req_prompt_len, settings)
    assert torch.equal(select_by_mass_triton(mass, layout, settings, fraction), want)
    assert torch.equal(select_by_mass_torch(mass, layout, settings, fraction), want)
    assert torch.equal(select_by_mass(mass, layout, settings), want)


def test_a_mass_of_one_keeps_every_causal_block_of_a_long_prompt() -> None:
    """The decay lowers a mass below 1 only: --prefill-ext-sparse-mass 1 is dense at any length."""
    layout = BlockLayout.build([16 * 60], [64], BLOCK, prompt_lens=torch.tensor([1 << 20]))
    settings = SparseSettings(block_size=BLOCK, mass=1.0, mass_decay=0.2, mass_len=1024)
    assert mass_fraction(layout.req_prompt_len, settings).tolist() == [1.0]
    mass = torch.rand(2, layout.num_rows, layout.max_key_blocks, generator=torch.Generator().manual_seed(5))
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    assert torch.equal(select_by_mass(mass * causal[None], layout, settings), causal[None].expand_as(mass))


def test_a_chunk_selects_at_its_whole_prompts_mass() -> None:
    """Two requests with the same rows and masses: the one whose prompt runs on past this chunk (4x
    `mass_len`) keeps fewer blocks than the one that ends here (at `mass_len`)."""
    layout = BlockLayout.build([16 * 60, 16 * 60], [64, 64], BLOCK, prompt_lens=torch.tensor([1024, 4096]))
    assert layout.req_ends_prompt.tolist() == [True, False]
    gen = torch.Generator().manual_seed(3)
    half = layout.num_rows // 2
    mass = torch.rand(2, half, layout.max_key_blocks, generator=gen).repeat(1, 2, 1)
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    settings = SparseSettings(block_size=BLOCK, mass=0.8, mass_decay=0.2, mass_len=1024, last_blocks=0)
    kept = select_by_mass_torch(
        mass * causal[None], layout, settings, mass_fraction(layout.req_prompt_len, settings)
    ).sum(-1)
    assert bool((kept[:, half:] < kept[:, :half]).all())
    assert torch.equal(
        select_by_mass_triton(
            mass * causal[None], layout, settings, mass_fraction(layout.req_prompt_len, settings)
        ),
        select_by_mass_torch(
            mass * causal[None], layout, settings, mass_fraction(layout.req_prompt_len, settings)
        ),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("decay", [0.0, 0.075])
def test_the_mass_selection_kernel_on_cuda_keeps_what_the_fp32_sort_keeps(decay: float) -> None:
    """The compiled kernel (its sums in another order than the CPU's) against the torch sort in fp32 on the
    CPU, a 128K prompt's chunk beside a short request: the same blocks but where a row's threshold sits within
    rounding of a cumulative sum (then one block more or fewer)."""
    prompt_lens = torch.tensor([131072, 600])
    layout = BlockLayout.build([16 * 400, 0], [160, 600], BLOCK, prompt_lens=prompt_lens)
    gen = torch.Generator().manual_seed(11)
    mass = torch.randn(12, layout.num_rows, layout.max_key_blocks, generator=gen).exp() ** 3
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    mass = mass * causal[None]
    mass /= mass.sum(-1, keepdim=True)
    settings = SparseSettings(block_size=BLOCK, mass=0.8, mass_decay=decay, mass_len=2048, local_blocks=2)
    want = select_by_mass_torch(mass, layout, settings, mass_fraction(layout.req_prompt_len, settings))
    cuda = BlockLayout.build([16 * 400, 0], [160, 600], BLOCK, "cuda", prompt_lens=prompt_lens.cuda())
    got = select_by_mass_triton(
        mass.cuda(), cuda, settings, mass_fraction(cuda.req_prompt_len, settings)
    ).cpu()
    rows_differ = (got != want).any(-1)
    assert float(rows_differ.float().mean()) < 0.02
    assert bool(((got.sum(-1) - want.sum(-1)).abs() <= 1).all())
