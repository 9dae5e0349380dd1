"""bench.accuracy.blend_accuracy on a tiny random Llama (no download) over byte-tokenized rag_qa items:
recomputing every chunk token scores exactly as full prefill, the scores and argmax are the model's own,
and the summary's counts, McNemar p and perplexity follow from the rows."""

from __future__ import annotations

import argparse
import math
import random

import pytest
import torch

from bench.accuracy import blend_accuracy as ba
from bench.accuracy import rag_qa
from bench.accuracy.ruler_forced import answer_ids
from sglang_prefill_ext.blend.prefill import Decoder, Rule
from tests.tiny_models import tiny


def encode(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    return Decoder.of(tiny("llama"))


@pytest.fixture(scope="module")
def item() -> rag_qa.Item:
    lines = rag_qa.corpus_lines("stdlib-code", 50_000)
    return rag_qa.build_item("multihop", lines, encode, random.Random(0), 3, 40, 60)


@torch.no_grad()
def test_every_chunk_token_recomputed_scores_as_full(decoder: Decoder, item: rag_qa.Item) -> None:
    _, answer = answer_ids(encode, item.question)
    configs = [ba.parse_config(c) for c in ("fixed:1", "deviation:1", "fixed:0", "deviation:0.2")]
    results = ba.run_item(decoder, item, answer, configs, check_layer=1)
    assert list(results) == ["full", "fixed:1", "deviation:1", "fixed:0", "deviation:0.2"]
    for name in ("fixed:1", "deviation:1"):
        assert results[name]["logprob"] == results["full"]["logprob"]
        assert results[name]["recomputed"] == 1.0
    assert results["fixed:0"]["recomputed"] == 0.0
    chunk_tokens = sum(e - s for s, e in item.spans)
    assert results["deviation:0.2"]["recomputed"] == pytest.approx(round(0.2 * chunk_tokens) / chunk_tokens)
    assert results["fixed:0"]["logprob"] != results["full"]["logprob"]
    # the full prefill's score is the model's own forward's
    logp = decoder.model(torch.tensor([item.ids + answer])).logits[0].log_softmax(-1)
    rows = torch.arange(len(item.ids) - 1, len(item.ids) + len(answer) - 1)
    assert results["full"]["logprob"] == pytest.approx(
        float(logp[rows, torch.tensor(answer)].sum()), abs=1e-3
    )
    assert results["full"]["argmax"] == logp[rows].argmax(-1).tolist()
    assert results["full"]["right"] == (results["full"]["argmax"] == answer)


def test_summarize_counts_against_full() -> None:
    def rows(rights: list[bool], logprob: float) -> list[dict[str, object]]:
        return [
            dict(family="single", right=r, logprob=logprob, answer_tokens=2, recomputed=0.25, forward_s=1.0)
            for r in rights
        ]

    full = [True] * 8 + [False] * 2
    blend = [False] * 3 + [True] * 5 + [True, False]
    summary = ba.summarize({"full": rows(full, -0.2), "fixed:0.15": rows(blend, -0.22)})
    cell = summary["fixed:0.15"]["single"]
    assert (cell["n"], cell["full"], cell["right"], cell["lost"], cell["gained"]) == (10, 8, 6, 3, 1)
    assert cell["p"] == pytest.approx(0.625)  # 2 * P(X <= 1), X ~ Binomial(4, 1/2)
    assert cell["keep"] == 0.75 and not cell["passes"]
    assert cell["ppl"] == pytest.approx(math.exp(0.11)) and cell["ppl_change"] == pytest.approx(
        math.exp(0.01) - 1
    )
    assert summary["full"]["single"]["passes"] and summary["full"]["single"]["ppl_change"] == 0
    assert "| fixed:0.15 | single | 10 | 8 | 6 | 3 | 1 | 0.625 | 0.750 |" in ba.report(summary)


@torch.no_grad()
def test_a_deviation_config_may_name_its_check_layer(decoder: Decoder, item: rag_qa.Item) -> None:
    assert ba.parse_config("deviation:0.15@3") == ba.Config("deviation:0.15@3", Rule.DEVIATION, 0.15, 3)
    assert ba.parse_config("fixed:0.15").check_layer is None
    _, answer = answer_ids(encode, item.question)
    configs = [ba.parse_config(c) for c in ("deviation:0.3@0", "deviation:0.3@2", "deviation:0.3")]
    results = ba.run_item(decoder, item, answer, configs, check_layer=2)
    assert results["deviation:0.3@2"]["logprob"] == results["deviation:0.3"]["logprob"]
    assert results["deviation:0.3@0"]["logprob"] != results["deviation:0.3"]["logprob"]


@pytest.mark.parametrize(
    "text",
    ["fixed", "deviation:x", "random:0.1", "fixed:1.5", "fixed:0.1@2", "deviation:0.1@x", "deviation:0.1@-1"],
)
def test_a_malformed_config_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="RULE:RATIO"):
        ba.parse_config(text)
