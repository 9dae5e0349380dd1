"""The serving plan (blend.plan): a blended prompt as computed and reused runs. Its computed tokens are
the fixed rule's, its runs tile the positions past the tree's match, and running the computed runs one
after another as plain extends over the blended KV gives the one-pass blended prefill (tiny random
Llama and Qwen2 decoders, float32)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sglang_prefill_ext.blend.plan import BlendCounts, Lookup, lookups, plan
from sglang_prefill_ext.blend.prefill import Decoder, Rule, blended_prefill, cached_chunk, reused_kv
from sglang_prefill_ext.blend.select import fixed_ratio
from sglang_prefill_ext.blend.spans import Span
from sglang_prefill_ext.ops.blend_attention import blend_attention
from tests.tiny_models import VOCAB, tiny

SYSTEM = 7
SPANS = ((7, 27), (29, 53), (55, 70))
PROMPT_LEN = 80


@st.composite
def prompts(draw: st.DrawFn) -> tuple[int, tuple[Span, ...], int, int, frozenset[int], float]:
    """A prompt, disjoint spans, a matched prefix, a page size, the spans that hit, a ratio."""
    prompt_len = draw(st.integers(2, 120))
    cuts = sorted(draw(st.sets(st.integers(0, prompt_len), max_size=10)))
    spans = tuple((a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if a < b)
    prefix_len = draw(st.integers(0, prompt_len - 1))
    page_size = draw(st.sampled_from((1, 4)))
    hit = frozenset(draw(st.sets(st.integers(0, max(len(spans) - 1, 0)))))
    ratio = draw(st.sampled_from((0.0, 0.15, 0.5, 1.0)))
    return prompt_len, spans, prefix_len, page_size, hit, ratio


@given(prompts())
def test_runs_tile_the_unmatched_positions_and_compute_the_fixed_rules_tokens(case) -> None:
    prompt_len, spans, prefix_len, page_size, hit, ratio = case
    asked = lookups(spans, prefix_len, page_size)
    hits = {lookup.index: 1000 + 3 * lookup.index for lookup in asked if lookup.index in hit}
    result = plan(prompt_len, prefix_len, spans, asked, hits, ratio)
    assert result.runs[0].start == prefix_len and result.runs[-1].end == prompt_len
    assert all(a.end == b.start for a, b in zip(result.runs, result.runs[1:], strict=False))
    assert all(run.start < run.end for run in result.runs)
    assert not result.runs[0].reused and not result.runs[-1].reused
    computed = torch.zeros(prompt_len, dtype=torch.bool)
    for run in result.extends:
        computed[run.start : run.end] = True
    # where every looked-up span hit and reuses a page-aligned head, the rule's mask is the plan's
    expected = fixed_ratio(spans, prompt_len, ratio)
    for lookup in asked:
        start, end = spans[lookup.index]
        expected[start + lookup.length : end] = True  # a tail shorter than a page is computed
        if lookup.index not in hits:
            expected[start:end] = True
    for index, (start, end) in enumerate(spans):
        if all(lookup.index != index for lookup in asked):
            expected[start:end] = True
    expected[:prefix_len] = False
    expected[prefix_len] = expected[prompt_len - 1] = True  # the first extend's first, the last logits
    assert computed.tolist() == expected.tolist()
    assert result.reused_tokens == int((~computed[prefix_len:]).sum())
    for run in result.runs:
        if run.reused:
            start, _ = spans[run.span]
            assert run.cached_start == hits[run.span] + run.start - start
    assert {lookup.index for lookup in result.stores} == {lookup.index for lookup in asked} - set(hits)
    assert result.exact_len == next((run.start for run in result.runs if run.reused), prompt_len)


def test_lookups_skip_wholly_matched_and_sub_page_spans() -> None:
    spans = ((0, 10), (10, 13), (13, 30))
    assert lookups(spans, 5, 4) == (Lookup(0, 0, 8), Lookup(2, 13, 16))
    assert lookups(spans, 10, 4) == (Lookup(2, 13, 16),)
    assert lookups(spans, 0, 1) == (Lookup(0, 0, 10), Lookup(1, 10, 3), Lookup(2, 13, 17))


def test_a_span_the_match_ends_in_reuses_past_it() -> None:
    """The tree holds a chunk's exact head (an earlier blended request's): the rest is reused but for
    its first token past the match (a server's first extend starts the request)."""
    spans = ((4, 20),)
    result = plan(30, 10, spans, lookups(spans, 10, 1), {0: 4}, 0.25)
    runs = [(run.start, run.end, run.cached_start) for run in result.runs]
    assert runs == [(10, 11, None), (11, 20, 11), (20, 30, None)]
    assert result.counts(spans) == BlendCounts(chunk_tokens=10, hits=1, reused_tokens=9, recomputed_tokens=1)


def test_ratio_one_reuses_nothing_and_is_one_extend() -> None:
    asked = lookups(SPANS, SYSTEM, 1)
    result = plan(PROMPT_LEN, SYSTEM, SPANS, asked, {i: 0 for i in range(len(SPANS))}, 1.0)
    assert [(run.start, run.end) for run in result.runs] == [(SYSTEM, PROMPT_LEN)]
    assert result.reused_tokens == 0 and result.exact_len == PROMPT_LEN


def test_a_prompt_ending_in_a_chunk_computes_its_last_token() -> None:
    spans = ((4, 20),)
    result = plan(20, 0, spans, lookups(spans, 0, 1), {0: 4}, 0.25)
    assert [(run.start, run.end, run.reused) for run in result.runs] == [
        (0, 8, False),
        (8, 19, True),
        (19, 20, False),
    ]


@pytest.mark.parametrize(("prompt_len", "prefix_len"), [(10, 10), (10, -1)])
def test_a_prefix_leaving_nothing_to_compute_is_refused(prompt_len: int, prefix_len: int) -> None:
    with pytest.raises(ValueError, match="must leave a token"):
        plan(prompt_len, prefix_len, (), (), {}, 0.5)


@torch.no_grad()
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("ratio", [0.0, 0.15, 0.5])
def test_the_extends_in_turn_are_the_one_pass_blend(model_type: str, ratio: float) -> None:
    pytest.importorskip("transformers")
    decoder = Decoder.of(tiny(model_type))
    ids = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1)).tolist()
    chunks = [cached_chunk(decoder, ids[:SYSTEM], ids[s:e]) for s, e in SPANS]
    one_pass = blended_prefill(
        decoder, ids, SPANS, reused_kv(decoder, PROMPT_LEN, SPANS, chunks), ratio, Rule.FIXED
    )
    asked = lookups(SPANS, 0, 1)
    result = plan(PROMPT_LEN, 0, SPANS, asked, {i: chunk.position for i, chunk in enumerate(chunks)}, ratio)
    assert len(result.extends) == len(SPANS) + 1  # every chunk reuses its tail: one pass after each
    kv = reused_kv(decoder, PROMPT_LEN, SPANS, chunks)
    ids_t = torch.tensor(ids)
    for run in result.extends:
        rows = torch.zeros(PROMPT_LEN, dtype=torch.bool)
        rows[run.start : run.end] = True
        last = decoder.forward(ids_t, kv, rows, None, blend_attention)
    torch.testing.assert_close(kv.k, one_pass.kv.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv.v, one_pass.kv.v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last.hidden[-1], one_pass.hidden[-1], rtol=1e-5, atol=1e-5)
    recomputed = sum(math.ceil(ratio * (e - s)) for s, e in SPANS)
    assert PROMPT_LEN - result.reused_tokens == PROMPT_LEN - sum(e - s for s, e in SPANS) + recomputed
