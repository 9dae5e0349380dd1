"""The reference blended prefill (blend.prefill) on tiny random Llama and Qwen2 decoders in float32: its
forward is the model's own, at ratio 1.0 a blend is the full prefill, reused KV that is exact gives the
full prefill at ratio 0, and each rule computes the rows it says."""

from __future__ import annotations

import pytest
import torch

from sglang_prefill_ext.blend.prefill import (
    KV,
    CachedChunk,
    Decoder,
    Rule,
    blended_prefill,
    cached_chunk,
    full_prefill,
    reused_kv,
)
from sglang_prefill_ext.blend.select import chunk_mask, fixed_ratio, kv_deviation, largest_deviation
from sglang_prefill_ext.ops.blend_attention import blend_attention_fp32
from sglang_prefill_ext.ops.rerotate import rerotate
from tests.tiny_models import VOCAB, tiny

pytest.importorskip("transformers")

SYSTEM = 7
SPANS = ((7, 27), (29, 53), (55, 70))  # three chunks, glue between them, a 10-token question after
PROMPT_LEN = 80


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def decoder(request: pytest.FixtureRequest) -> Decoder:
    return Decoder.of(tiny(request.param))


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1)).tolist()


def isolated_chunks(decoder: Decoder, ids: list[int]) -> list[CachedChunk]:
    """Each chunk as the store caches it the first time: after the system prompt alone."""
    return [cached_chunk(decoder, ids[:SYSTEM], ids[s:e]) for s, e in SPANS]


@torch.no_grad()
def test_the_forward_is_the_models_own(decoder: Decoder, ids: list[int]) -> None:
    full = full_prefill(decoder, ids)
    theirs = decoder.model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(decoder.logits(full.hidden), theirs, rtol=1e-4, atol=1e-4)
    assert full.rows.tolist() == list(range(PROMPT_LEN))


@torch.no_grad()
@pytest.mark.parametrize("rule", list(Rule))
def test_at_ratio_1_a_blend_is_the_full_prefill(decoder: Decoder, ids: list[int], rule: Rule) -> None:
    full = full_prefill(decoder, ids)
    reused = reused_kv(decoder, PROMPT_LEN, SPANS, isolated_chunks(decoder, ids))
    # the first chunk follows the system prompt in both, the second does not
    assert not torch.allclose(reused.k[:, 29:53], full.kv.k[:, 29:53], atol=1e-3)
    blend = blended_prefill(decoder, ids, SPANS, reused, 1.0, rule)
    assert bool(blend.computed.all())
    assert torch.equal(blend.hidden, full.hidden)
    assert torch.equal(blend.kv.k, full.kv.k) and torch.equal(blend.kv.v, full.kv.v)


@torch.no_grad()
@pytest.mark.parametrize("rule", list(Rule))
def test_exact_kv_cached_elsewhere_blends_to_the_full_prefill_at_ratio_0(
    decoder: Decoder, ids: list[int], rule: Rule
) -> None:
    """Each chunk's in-context KV, cached 100 positions further on: re-positioning alone must bring it back."""
    full = full_prefill(decoder, ids)
    chunks = []
    for start, end in SPANS:
        kv = full.kv.slice(start, end)
        here = torch.arange(start, end)
        for layer in range(kv.k.shape[0]):
            kv.k[layer] = rerotate(kv.k[layer], here, here + 100, decoder.rope)
        chunks.append(CachedChunk(kv, start + 100))
    blend = blended_prefill(decoder, ids, SPANS, reused_kv(decoder, PROMPT_LEN, SPANS, chunks), 0.0, rule)
    assert torch.equal(blend.computed, ~chunk_mask(SPANS, PROMPT_LEN))
    torch.testing.assert_close(blend.hidden, full.hidden[blend.rows], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_the_fixed_rule_computes_each_chunks_head_and_leaves_the_rest_reused(
    decoder: Decoder, ids: list[int]
) -> None:
    reused = reused_kv(decoder, PROMPT_LEN, SPANS, isolated_chunks(decoder, ids))
    before = reused.k.clone(), reused.v.clone()
    blend = blended_prefill(decoder, ids, SPANS, reused, 0.2, Rule.FIXED)
    expected = fixed_ratio(SPANS, PROMPT_LEN, 0.2)
    assert torch.equal(blend.computed, expected)
    assert blend.rows.tolist() == expected.nonzero()[:, 0].tolist()
    kept = ~expected
    assert torch.equal(blend.kv.k[:, kept], before[0][:, kept]) and torch.equal(
        blend.kv.v[:, kept], before[1][:, kept]
    )
    assert not torch.allclose(blend.kv.k[:, expected], before[0][:, expected])


@torch.no_grad()
@pytest.mark.parametrize("check_layer", [0, 1, 2])
def test_the_deviation_rule_keeps_the_largest_kv_deviation_at_its_layer(
    decoder: Decoder, ids: list[int], check_layer: int
) -> None:
    full = full_prefill(decoder, ids)
    reused = reused_kv(decoder, PROMPT_LEN, SPANS, isolated_chunks(decoder, ids))
    before = reused.k.clone(), reused.v.clone()
    blend = blended_prefill(decoder, ids, SPANS, reused, 0.25, Rule.DEVIATION, check_layer)
    # Up to the check layer every row runs over fresh KV, so its fresh KV there is the full prefill's.
    deviation = kv_deviation(
        full.kv.k[check_layer], full.kv.v[check_layer], before[0][check_layer], before[1][check_layer]
    )
    expected = largest_deviation(SPANS, deviation, 0.25)
    assert torch.equal(blend.computed, expected)
    assert int((expected & chunk_mask(SPANS, PROMPT_LEN)).sum()) == round(0.25 * 59)
    upto = slice(0, check_layer + 1)
    assert torch.equal(blend.kv.k[upto], full.kv.k[upto]) and torch.equal(blend.kv.v[upto], full.kv.v[upto])
    later, kept = slice(check_layer + 1, None), ~expected
    assert torch.equal(blend.kv.k[later][:, kept], before[0][later][:, kept])


@torch.no_grad()
def test_the_fp32_reference_attention_gives_the_same_blend(decoder: Decoder, ids: list[int]) -> None:
    chunks = isolated_chunks(decoder, ids)

    def blend(**attention: object):
        reused = reused_kv(decoder, PROMPT_LEN, SPANS, chunks)
        return blended_prefill(decoder, ids, SPANS, reused, 0.15, Rule.DEVIATION, **attention)

    ours, reference = blend(), blend(attention=blend_attention_fp32)
    assert torch.equal(ours.computed, reference.computed)
    torch.testing.assert_close(ours.hidden, reference.hidden, rtol=1e-5, atol=1e-5)


def test_models_it_does_not_compute_are_refused() -> None:
    model = tiny("llama")
    model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    with pytest.raises(ValueError, match="plain RoPE"):
        Decoder.of(model)
    model.config.model_type = "qwen3"
    with pytest.raises(ValueError, match="qwen3"):
        Decoder.of(model)


def test_a_chunk_must_fit_its_span(decoder: Decoder, ids: list[int]) -> None:
    chunks = isolated_chunks(decoder, ids)
    with pytest.raises(ValueError, match=r"span \[55, 70\) holds 15 tokens, its chunk 20"):
        reused_kv(decoder, PROMPT_LEN, SPANS, chunks[:2] + [chunks[0]])


@torch.no_grad()
@pytest.mark.parametrize("rule", list(Rule))
def test_the_recomputed_rows_kv_replaces_the_reused_at_every_layer(
    decoder: Decoder, ids: list[int], rule: Rule
) -> None:
    """Reused KV exact but for the rows the rule recomputes, which hold noise: the blend is the full prefill.
    A recompute lost after any layer keeps noise there, and a deviation rule that keeps other rows (the
    noise deviates most at its check layer) computes over it."""
    full = full_prefill(decoder, ids)
    ratio = 0.3
    if rule is Rule.FIXED:
        noisy = fixed_ratio(SPANS, PROMPT_LEN, ratio) & chunk_mask(SPANS, PROMPT_LEN)
    else:
        chunk_rows = chunk_mask(SPANS, PROMPT_LEN).nonzero()[:, 0]
        picked = torch.randperm(len(chunk_rows), generator=torch.Generator().manual_seed(2))
        noisy = torch.zeros(PROMPT_LEN, dtype=torch.bool)
        noisy[chunk_rows[picked[: round(ratio * len(chunk_rows))]]] = True
    reused = KV(full.kv.k.clone(), full.kv.v.clone())
    noise = torch.Generator().manual_seed(3)
    reused.k[:, noisy] = torch.randn(reused.k[:, noisy].shape, generator=noise)
    reused.v[:, noisy] = torch.randn(reused.v[:, noisy].shape, generator=noise)
    blend = blended_prefill(decoder, ids, SPANS, reused, ratio, rule)
    assert torch.equal(blend.computed & chunk_mask(SPANS, PROMPT_LEN), noisy)
    torch.testing.assert_close(blend.kv.k, full.kv.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(blend.kv.v, full.kv.v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(blend.hidden, full.hidden[blend.rows], rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("rule", list(Rule))
def test_the_blend_moves_toward_the_full_prefill_as_the_ratio_rises(
    decoder: Decoder, ids: list[int], rule: Rule
) -> None:
    """Chunks cached apart (the cross-chunk attention missing): the question's hidden states err less
    from the full prefill's the more chunk tokens are recomputed, and not at all when every one is."""
    full = full_prefill(decoder, ids)
    chunks = isolated_chunks(decoder, ids)
    question = slice(SPANS[-1][1], PROMPT_LEN)

    def error(ratio: float) -> float:
        blend = blended_prefill(
            decoder, ids, SPANS, reused_kv(decoder, PROMPT_LEN, SPANS, chunks), ratio, rule
        )
        rows = blend.rows.tolist()
        at = [rows.index(p) for p in range(question.start, question.stop)]
        return float((blend.hidden[at] - full.hidden[question]).norm() / full.hidden[question].norm())

    errors = [error(r) for r in (0.0, 0.15, 0.5, 0.8, 1.0)]
    assert errors[0] > 0.01 and errors[1] != errors[0]
    assert errors[0] > errors[2] > errors[3] > errors[4] == 0.0
