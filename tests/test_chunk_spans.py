"""chunk_spans, the request field that marks a prompt's retrieved chunks: what is accepted, and the
one-sentence ValueError (SGLang's HTTP server answers it with status 400) for what is not."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_prefill_ext.blend.spans import parse_chunk_spans


def test_spans_in_order_are_the_chunks() -> None:
    assert parse_chunk_spans([[0, 3], [3, 10], [12, 20]], 20) == ((0, 3), (3, 10), (12, 20))
    assert parse_chunk_spans(None, 5) == () == parse_chunk_spans([], 5)


@pytest.mark.parametrize(
    "spans",
    [
        [0, 3],
        [(0, 3)],
        [[0, 3, 5]],
        [[0]],
        [[0.0, 3]],
        [["0", "3"]],
        [[True, 3]],
        "0:3",
        {"0": 3},
        [[0, None]],
    ],
)
def test_anything_but_a_list_of_integer_pairs_is_refused(spans: object) -> None:
    with pytest.raises(ValueError) as refused:
        parse_chunk_spans(spans, 10)
    assert str(refused.value) == "chunk_spans must be a list of [start, end] pairs of integer token offsets."


@pytest.mark.parametrize("span", [[-1, 3], [0, 11], [4, 4], [5, 2]])
def test_a_span_outside_the_prompt_or_empty_is_refused(span: list[int]) -> None:
    with pytest.raises(ValueError) as refused:
        parse_chunk_spans([[0, 1], span], 10)
    assert str(refused.value) == (
        f"chunk_spans[1] = [{span[0]}, {span[1]}] is not a non-empty span of the prompt's 10 tokens; "
        "valid spans are [start, end) with 0 <= start < end <= 10."
    )


@pytest.mark.parametrize("spans", [[[0, 5], [4, 8]], [[5, 8], [0, 2]]])
def test_overlapping_or_unordered_spans_are_refused(spans: list[list[int]]) -> None:
    with pytest.raises(ValueError) as refused:
        parse_chunk_spans(spans, 10)
    start, end = spans[1]
    assert str(refused.value) == (
        f"chunk_spans[1] = [{start}, {end}] starts before chunk_spans[0] ends ({spans[0][1]}); "
        "spans must be in order and must not overlap."
    )


@given(
    prompt_len=st.integers(0, 40),
    spans=st.lists(st.lists(st.integers(-3, 45), min_size=2, max_size=2), max_size=6),
)
def test_exactly_the_disjoint_ordered_spans_inside_the_prompt_are_accepted(
    prompt_len: int, spans: list[list[int]]
) -> None:
    valid = all(0 <= start < end <= prompt_len for start, end in spans) and all(
        a[1] <= b[0] for a, b in itertools.pairwise(spans)
    )
    if valid:
        assert parse_chunk_spans(spans, prompt_len) == tuple(map(tuple, spans))
    else:
        with pytest.raises(ValueError, match=r"^chunk_spans\[\d+\] = "):
            parse_chunk_spans(spans, prompt_len)
