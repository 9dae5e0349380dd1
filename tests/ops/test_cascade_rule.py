"""The cascade-vs-stock cost rule's decisions (CPU)."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_prefill_ext.ops.cascade_rule import (
    DEFAULT_COSTS,
    CascadeCosts,
    CascadeShape,
    choose_cascade,
    model_ms,
    pair_flops,
)

# cascade's shared pass twice as fast as stock's paged prefix pass, negligible plan cost
FAST_SHARED = CascadeCosts(
    shared_paged_tflops=1070.0, shared_contiguous_tflops=1070.0, plan_ms=0.1, pass_us=10.0
)


def _shape(shared: int, prefix: list[int], extend: list[int], contiguous: bool = False) -> CascadeShape:
    return CascadeShape(shared, prefix, extend, contiguous, 32, 128, 32)


BURST = _shape(32768, [32768] * 16, [512] * 16)


def test_pair_flops_counts_the_causal_triangle() -> None:
    assert pair_flops(4, 10, False, 1, 1) == 4 * 40
    assert pair_flops(4, 10, True, 1, 1) == 4 * (40 - 6)
    assert pair_flops(1, 1, True, 1, 1) == 4


def test_measured_defaults_match_the_h200_bench() -> None:
    """2026-11-29 H200: 16x512 over 32K ran 1.03x scattered, 1.25x over contiguous slots."""
    scattered = choose_cascade(BURST, 1024, 1.1)
    assert not scattered.use_cascade
    assert 0.95 < scattered.speedup < 1.1
    contiguous = choose_cascade(dataclasses.replace(BURST, shared_contiguous=True), 1024, 1.1)
    assert contiguous.use_cascade
    assert 1.1 < contiguous.speedup < 1.35
    stock, cascade = model_ms(BURST, DEFAULT_COSTS)
    assert stock == pytest.approx(scattered.stock_ms) and cascade == pytest.approx(scattered.cascade_ms)


def test_min_speedup_zero_forces_every_eligible_batch() -> None:
    assert choose_cascade(BURST, 1024, 0.0).use_cascade
    assert not choose_cascade(_shape(512, [512] * 16, [512] * 16), 1024, 0.0).use_cascade
    assert not choose_cascade(_shape(32768, [32768], [512]), 1024, 0.0).use_cascade


def test_a_faster_shared_pass_wins_when_the_shared_prefix_dominates() -> None:
    decision = choose_cascade(BURST, 1024, 1.1, FAST_SHARED)
    assert decision.use_cascade
    assert 1.5 < decision.speedup < 2.0  # the shared part is ~97 % of the FLOPs
    # a short shared prefix under long own remainders: little to gain
    small = _shape(2048, [30000, 31000], [512, 512])
    assert not choose_cascade(small, 1024, 1.1, FAST_SHARED).use_cascade


def test_contiguous_rate_applies_only_to_contiguous_prefixes() -> None:
    costs = dataclasses.replace(DEFAULT_COSTS, shared_contiguous_tflops=1070.0, plan_ms=0.1)
    assert choose_cascade(dataclasses.replace(BURST, shared_contiguous=True), 1024, 1.1, costs).use_cascade
    assert not choose_cascade(BURST, 1024, 1.1, costs).use_cascade


def test_plan_cost_and_fixed_costs_sink_small_batches() -> None:
    tiny = _shape(1024, [1024] * 2, [8] * 2)
    assert not choose_cascade(tiny, 1024, 1.1, FAST_SHARED).use_cascade
    stock, cascade = model_ms(tiny, FAST_SHARED)
    assert cascade > stock


def test_min_shared_must_be_positive() -> None:
    with pytest.raises(ValueError):
        choose_cascade(BURST, 0, 1.1)
