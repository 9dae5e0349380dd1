"""The recompute rules of blend.select: which chunk tokens a blended prefill computes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sglang_prefill_ext.blend.select import chunk_mask, fixed_ratio, kv_deviation, largest_deviation

SPANS = ((2, 6), (6, 16), (20, 23))  # chunks of 4, 10 and 3 tokens in a 25-token prompt
OUTSIDE = [0, 1, 16, 17, 18, 19, 23, 24]


def _positions(mask: torch.Tensor) -> list[int]:
    return mask.nonzero()[:, 0].tolist()


def test_chunk_mask_marks_the_spans() -> None:
    assert _positions(~chunk_mask(SPANS, 25)) == OUTSIDE


@pytest.mark.parametrize(
    ("ratio", "heads"),
    [(0.0, (0, 0, 0)), (0.15, (1, 2, 1)), (0.5, (2, 5, 2)), (1.0, (4, 10, 3))],
)
def test_fixed_ratio_computes_each_chunks_first_ceil_share(ratio: float, heads: tuple[int, ...]) -> None:
    expected = sorted(OUTSIDE + [s + i for (s, _), n in zip(SPANS, heads, strict=True) for i in range(n)])
    assert _positions(fixed_ratio(SPANS, 25, ratio)) == expected


def test_largest_deviation_keeps_the_largest_over_all_chunks_and_ignores_the_rest() -> None:
    deviation = torch.zeros(25)
    deviation[[3, 9, 21, 12]] = torch.tensor([5.0, 7.0, 6.0, 1.0])
    deviation[OUTSIDE] = 100.0  # outside every span: always computed, never counted
    computed = largest_deviation(SPANS, deviation, 3 / 17)  # round(3 / 17 * 17) = 3 of the 17 chunk tokens
    assert _positions(computed) == sorted(OUTSIDE + [3, 9, 21])


def test_largest_deviation_breaks_ties_towards_the_earlier_token() -> None:
    computed = largest_deviation(SPANS, torch.ones(25), 2 / 17)
    assert _positions(computed) == sorted(OUTSIDE + [2, 3])


@pytest.mark.parametrize("rule", ["fixed", "deviation"])
@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_a_ratio_outside_0_1_is_refused(rule: str, ratio: float) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        if rule == "fixed":
            fixed_ratio(SPANS, 25, ratio)
        else:
            largest_deviation(SPANS, torch.zeros(25), ratio)


def test_kv_deviation_is_the_squared_distance_of_k_plus_that_of_v() -> None:
    k, v = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    fresh_k, fresh_v = k.clone(), v.clone()
    fresh_k[0, 1, 2] = 2.0
    fresh_v[1, 0, :] = 1.0
    assert kv_deviation(fresh_k, fresh_v, k, v).tolist() == [4.0, 4.0]


@given(
    lengths=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=6),
    ratio=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_both_rules_recompute_their_share_and_every_token_outside_the_chunks(
    lengths: list[tuple[int, int]], ratio: float, seed: int
) -> None:
    spans, end = [], 0
    for gap, size in lengths:
        spans.append((end + gap, end + gap + size))
        end += gap + size
    spans_t, prompt_len = tuple(spans), end + 3
    outside = ~chunk_mask(spans_t, prompt_len)
    deviation = torch.rand(prompt_len, generator=torch.Generator().manual_seed(seed))
    fixed = fixed_ratio(spans_t, prompt_len, ratio)
    chosen = largest_deviation(spans_t, deviation, ratio)
    for computed in (fixed, chosen):
        assert bool(computed[outside].all())
    assert int((fixed & ~outside).sum()) == sum(math.ceil(ratio * (e - s)) for s, e in spans_t)
    assert int((chosen & ~outside).sum()) == round(ratio * int((~outside).sum()))
    threshold = deviation[chosen & ~outside].min() if bool((chosen & ~outside).any()) else float("inf")
    assert bool((deviation[~chosen] <= threshold).all())
