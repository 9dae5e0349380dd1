"""The guard: sampled rows' kept share against an fp32 reference, planted needles, and nothing when off."""

from __future__ import annotations

import pytest
import torch
from kvpool import scattered_batch

from sglang_prefill_ext.ops import policy
from sglang_prefill_ext.ops.guard import kept_share, low_quantile
from sglang_prefill_ext.ops.layout import BlockLayout
from sglang_prefill_ext.ops.policy import SparsePrefill
from sglang_prefill_ext.ops.scorers.sampled import (
    block_mass_torch,
    block_mass_triton,
    row_mass_torch,
    row_mass_triton,
    sample_offsets,
)
from sglang_prefill_ext.ops.settings import GUARD_QUANTILE, SparseSettings

BLOCK = 16
SCALE = 32**-0.5


class RecordingAttention:
    """Stands in for FlashInfer (GPU only): records plans, returns zeros."""

    def __init__(self) -> None:
        self.plans = 0

    def plan(self, indices, *problem, reusable: bool) -> None:
        self.plans += 1

    def serves(self, problem) -> bool:
        return True

    def use_indices(self, kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> None:
        self.plans += 1

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(q)


def reference_shares(q, k_buffer, locs, layout, prefix, extend, samples, keep) -> torch.Tensor:
    """fp32, from scratch: each sampled query's softmax over its causal keys, summed over the key blocks
    `keep` [Hkv or Hq, R, C] keeps for its head: [Hq, R, samples]."""
    num_qo_heads = q.shape[1]
    group = num_qo_heads // k_buffer.shape[1]
    offsets = sample_offsets(layout, samples).long()
    out = torch.empty(num_qo_heads, layout.num_rows, samples)
    ctx_start, q_start = 0, 0
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        keys = k_buffer[locs[ctx_start : ctx_start + p + n].long()].double()
        for r in (layout.row_req == b).nonzero().flatten().tolist():
            for s in range(samples):
                token = int(layout.row_q_start[r]) + int(offsets[r, s])
                pos = p + token - q_start
                for h in range(num_qo_heads):
                    weights = torch.softmax(keys[: pos + 1, h // group] @ q[token, h].double() * SCALE, 0)
                    kept = keep[h * keep.shape[0] // num_qo_heads, r][torch.arange(pos + 1) // BLOCK]
                    out[h, r, s] = weights[kept].sum()
        ctx_start, q_start = ctx_start + p + n, q_start + n
    return out


@pytest.mark.parametrize("impl", [row_mass_triton, row_mass_torch])
@pytest.mark.parametrize("per_query_head", [False, True])
@pytest.mark.parametrize("samples", [1, 3])
def test_the_statistic_is_the_low_quantile_of_exact_kept_shares(
    impl, per_query_head: bool, samples: int
) -> None:
    prefix, extend = [0, 37, 80], [90, 29, 40]
    layout, q, k_buffer, locs = scattered_batch((6, 2), 32, prefix, extend, BLOCK, seed=4)
    heads = 6 if per_query_head else 2
    gen = torch.Generator().manual_seed(1)
    keep = torch.rand(heads, layout.num_rows, layout.max_key_blocks, generator=gen) < 0.5
    want = reference_shares(q, k_buffer, locs, layout, prefix, extend, samples, keep)
    share = kept_share(impl(q, k_buffer, locs, layout, samples, SCALE), keep)  # [Hkv, R, samples, group]
    got = share.permute(0, 3, 1, 2).reshape(6, layout.num_rows, samples)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    lower = torch.quantile(want.flatten(), GUARD_QUANTILE, interpolation="lower")
    assert low_quantile(share) == pytest.approx(float(lower), abs=2e-5)
    # every causal block kept: each row holds all of its attention
    every = torch.ones(heads, layout.num_rows, layout.max_key_blocks, dtype=torch.bool)
    full = kept_share(impl(q, k_buffer, locs, layout, samples, SCALE), every)
    torch.testing.assert_close(full, torch.ones_like(full))


@pytest.mark.parametrize(("rows", "low", "want"), [(1000, 9, 0.9), (1000, 10, 0.3), (7, 1, 0.3), (0, 0, 1.0)])
def test_the_quantile_lets_under_1_in_100_rows_lie_below_it(rows: int, low: int, want: float) -> None:
    """Of 1,000 shares 9 may be low, not 10; of fewer than 101 it is the minimum; of none, 1."""
    share = torch.full((rows,), 0.9)
    share[:low] = 0.3
    assert low_quantile(share[torch.randperm(rows)]) == pytest.approx(want)


@pytest.mark.parametrize(
    ("row_mass", "block_mass"), [(row_mass_triton, block_mass_triton), (row_mass_torch, block_mass_torch)]
)
def test_row_mass_averages_to_the_scorers_block_mass(row_mass, block_mass) -> None:
    layout, q, k_buffer, locs = scattered_batch((8, 2), 32, [0, 50], [70, 33], BLOCK, seed=2)
    rows = row_mass(q, k_buffer, locs, layout, 2, SCALE)  # [Hkv, R, C, samples, group]
    torch.testing.assert_close(rows.mean((3, 4)), block_mass(q, k_buffer, locs, layout, 2, SCALE))
    per_q = block_mass(q, k_buffer, locs, layout, 2, SCALE, per_query_head=True)
    torch.testing.assert_close(rows.mean(3).permute(0, 3, 1, 2).reshape(per_q.shape), per_q)


def _needle_batch(needle_row: int, needle_block: int, seed: int = 0):
    """One fresh prompt of 12 blocks; every query head of row block `needle_row` seeks one key of block
    `needle_block` (None: no needle)."""
    layout = BlockLayout.build([0], [12 * BLOCK], BLOCK)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(layout.num_tokens, 4, 32, generator=gen) * 0.3
    k_buffer = torch.randn(layout.num_context_tokens, 2, 32, generator=gen) * 0.3
    if needle_row is not None:
        needle = torch.randn(32, generator=gen)
        needle = 12.0 * needle / needle.norm()
        q[needle_row * BLOCK : (needle_row + 1) * BLOCK] += needle
        k_buffer[needle_block * BLOCK + 5] += needle
    return layout, q, k_buffer, torch.arange(layout.num_context_tokens)


def _forced(mask: torch.Tensor):
    return lambda q, k_buffer, sm_scale, layer=None: mask.clone()


def _causal(layout: BlockLayout, heads: int) -> torch.Tensor:
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    return causal[None].expand(heads, -1, -1).clone()


@pytest.mark.parametrize("per_query_head", [False, True])
def test_a_dropped_needle_declines_and_keeping_every_block_does_not(per_query_head: bool) -> None:
    layout, q, k_buffer, locs = _needle_batch(needle_row=9, needle_block=2)
    heads = 4 if per_query_head else 2
    settings = SparseSettings(
        block_size=BLOCK, scorer="sampled", per_query_head=per_query_head, guard=0.9, max_density=1.0
    )
    attention = RecordingAttention()
    sparse = SparsePrefill(settings, attention)
    everything = _causal(layout, heads)
    without_needle = everything.clone()
    without_needle[:, 9, 2] = False
    for mask, declined in ((without_needle, True), (everything, False)):
        sparse.begin(layout, locs)
        sparse.select = _forced(mask)
        out = sparse.attend(q, k_buffer, k_buffer, SCALE, layer=0)
        assert (out is None) == declined
        assert torch.equal(sparse.mask, mask)
    # the needle's rows held most of their attention in the dropped block: the statistic is low
    assert attention.plans == 1
    sparse.begin(layout, locs)
    sparse.select = _forced(without_needle)
    sparse.attend(q, k_buffer, k_buffer, SCALE, layer=0)
    assert sparse.guard_stat < 0.5
    sparse.begin(layout, locs)
    sparse.select = _forced(everything)
    sparse.attend(q, k_buffer, k_buffer, SCALE, layer=0)
    assert sparse.guard_stat == pytest.approx(1.0, abs=1e-5)


def test_the_real_selection_at_mass_1_keeps_the_needle_and_passes() -> None:
    layout, q, k_buffer, locs = _needle_batch(needle_row=9, needle_block=2)
    settings = SparseSettings(
        block_size=BLOCK, scorer="antidiagonal", stride=4, mass=1.0, guard=0.9, max_density=1.0
    )
    sparse = SparsePrefill(settings, RecordingAttention())
    sparse.begin(layout, locs)
    assert sparse.attend(q, k_buffer, k_buffer, SCALE, layer=0) is not None
    assert sparse.guard_stats == {0: pytest.approx(1.0, abs=1e-5)}


def test_later_layers_are_checked_every_n_and_a_shared_plan_is_measured_against_their_queries() -> None:
    """guard_every 2: sparse layers 0, 2, 4 are checked, 1 and 3 are not. With one plan per forward, layer
    2's queries seek a needle the first layer's selection dropped: the batch is declined there."""
    layout, quiet, k_buffer, locs = _needle_batch(needle_row=9, needle_block=2)
    _, seeking, _, _ = _needle_batch(needle_row=9, needle_block=2)
    quiet = quiet.clone()
    quiet[9 * BLOCK : 10 * BLOCK] = 0.0  # layer 0: the needle's rows attend evenly
    settings = SparseSettings(
        block_size=BLOCK, scorer="sampled", guard=0.5, guard_every=2, max_density=1.0, per_layer=False
    )
    sparse = SparsePrefill(settings, RecordingAttention())
    assert [sparse.guard_checks(layer) for layer in range(5)] == [True, False, True, False, True]
    mask = _causal(layout, 2)
    mask[:, 9, 2] = False
    sparse.begin(layout, locs)
    sparse.select = _forced(mask)
    outs = [
        sparse.attend(q, k_buffer, k_buffer, SCALE, layer=i) for i, q in enumerate((quiet, seeking, seeking))
    ]
    assert outs[0] is not None and outs[1] is not None and outs[2] is None
    assert sorted(sparse.guard_stats) == [0, 2]
    assert sparse.guard_stats[0] >= 0.5 > sparse.guard_stats[2] == sparse.guard_stat


def test_a_density_decline_comes_first_and_computes_no_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    layout, q, k_buffer, locs = _needle_batch(needle_row=None, needle_block=0)
    monkeypatch.setattr(policy, "row_mass", _never)
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK, guard=0.9, max_density=0.5), RecordingAttention())
    sparse.begin(layout, locs)
    sparse.select = _forced(_causal(layout, 4))
    assert sparse.attend(q, k_buffer, k_buffer, SCALE, layer=0) is None
    assert sparse.guard_stats == {} and sparse.guard_stat is None


def _never(*args, **kwargs):
    raise AssertionError("the guard ran")


@pytest.mark.parametrize("per_layer", [True, False])
def test_off_computes_nothing_and_plans_what_it_always_did(
    monkeypatch: pytest.MonkeyPatch, per_layer: bool
) -> None:
    """guard 0: no sampled rows, no statistic, every layer attends, and each plans the selection the
    scorer makes (the same masks as with the guard on and passing)."""
    layout, q, k_buffer, locs = _needle_batch(needle_row=9, needle_block=2)
    masks, plans = {}, {}
    for guard in (0.0, 1e-9):
        attention = RecordingAttention()
        sparse = SparsePrefill(
            SparseSettings(
                block_size=BLOCK, stride=4, guard=guard, guard_every=1, max_density=1.0, per_layer=per_layer
            ),
            attention,
        )
        sparse.begin(layout, locs)
        masks[guard] = []
        with monkeypatch.context() as patch:
            if guard == 0.0:
                patch.setattr(policy, "row_mass", _never)
            for i in range(3):
                out = sparse.attend(q * (1 + i), k_buffer, k_buffer, SCALE, layer=i)
                assert out is not None
                masks[guard].append(sparse.mask.clone())
        assert len(sparse.guard_stats) == (0 if guard == 0.0 else 3)
        plans[guard] = attention.plans
    assert plans[0.0] == plans[1e-9] == (3 if per_layer else 1)
    assert all(torch.equal(a, b) for a, b in zip(masks[0.0], masks[1e-9], strict=True))


def test_the_policy_runs_the_dense_layers_dense_and_a_declined_forward_dense_from_there() -> None:
    """`attend` decides: layers before `dense_layers` return None without selecting; the first sparse layer
    declines a too-dense selection, and every later layer of that forward is dense too, until `begin`."""
    layout, q, k_buffer, locs = _needle_batch(needle_row=9, needle_block=2)
    attention = RecordingAttention()
    settings = SparseSettings(block_size=BLOCK, dense_layers=2, max_density=0.0, per_layer=False)
    sparse = SparsePrefill(settings, attention)
    sparse.begin(layout, locs)
    assert [sparse.attend(q, k_buffer, k_buffer, SCALE, layer=i) for i in range(2)] == [None, None]
    assert sparse.mask is None and not sparse.declined
    assert sparse.takes(2) and sparse.attend(q, k_buffer, k_buffer, SCALE, layer=2) is None
    assert sparse.declined and sparse.mask is not None and not sparse.takes(3)
    assert sparse.attend(q, k_buffer, k_buffer, SCALE, layer=3) is None
    sparse.begin(layout, locs)
    assert not sparse.declined and sparse.takes(2)
