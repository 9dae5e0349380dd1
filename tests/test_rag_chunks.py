"""The rag-chunks workload (issue 40): its plan (k distinct chunks per question by Zipf popularity, in
relevance order) and the requests it sends (chunk_spans marking each chunk's exact ids wherever it
sits), without a server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from bench.lib.arrivals import RagChunksPlan, rag_chunks_plan
from bench.lib.client import Record
from bench.serving import ttft_bench
from bench.serving.workloads import Ctx, TokenSource, wl_rag_chunks


def test_each_question_retrieves_k_distinct_chunks_with_zipf_popularity() -> None:
    plan = rag_chunks_plan(
        random.Random(5), 400, catalogue=200, k=8, min_tokens=512, max_tokens=2048, zipf=1.0, rate=4.0
    )
    assert len(plan.lengths) == 200 and all(512 <= n <= 2048 for n in plan.lengths)
    assert all(len(set(chunks)) == 8 for chunks in plan.retrieved)
    uses = Counter(chunk for chunks in plan.retrieved for chunk in chunks)
    assert uses[0] > uses[9] > uses[99]  # popularity falls with rank (Zipf 1: about 1 / rank)
    firsts = Counter(chunks[0] for chunks in plan.retrieved)
    assert firsts[0] == max(firsts.values()) and len(firsts) > 10  # relevance order varies
    assert list(plan.at_s) == sorted(plan.at_s) and plan.at_s[0] == 0.0
    again = rag_chunks_plan(random.Random(5), 400, 200, 8, 512, 2048, 1.0, 4.0)
    assert again == plan


def test_reuse_counts_what_blending_and_prefix_caching_can_take() -> None:
    plan = RagChunksPlan(lengths=(10, 20, 30), at_s=(0.0, 1.0, 2.0), retrieved=((0, 1), (0, 2), (1, 0)))
    sent, seen, in_prefix = plan.reuse()
    assert sent == 30 + 40 + 30
    assert seen == 10 + 30  # (0, 2): chunk 0; (1, 0): both
    assert in_prefix == 10  # (0, 2) starts as (0, 1) did; (1, 0) starts unlike any earlier question


def test_k_beyond_the_catalogue_is_refused() -> None:
    with pytest.raises(ValueError, match="k must be in"):
        rag_chunks_plan(random.Random(0), 1, catalogue=4, k=5, min_tokens=1, max_tokens=2, zipf=1.0, rate=1.0)


class RecordingClient:
    """The `Client` surface a workload uses; records each request's ids and extra body fields."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[int], dict[str, Any]]] = []

    @contextlib.contextmanager
    def bar(self, total: int, name: str) -> Iterator[None]:
        yield

    async def generate(self, ids: list[int], *, extra_body: dict[str, Any], **fields: Any) -> Record:
        self.sent.append((ids, extra_body))
        return Record(
            label="t",
            workload=fields["workload"],
            group=fields["group"],
            idx=fields["idx"],
            prompt_tokens=len(ids),
            max_new_tokens=fields["max_new_tokens"],
            t_send=0.0,
        )


def test_requests_mark_each_chunk_by_its_exact_ids() -> None:
    parser = argparse.ArgumentParser()
    ttft_bench.add_workload_args(parser)
    args = parser.parse_args(
        ["--rag-chunks-questions", "30", "--rag-chunks-catalogue", "12", "--rag-chunks-k", "4",
         "--rag-chunks-min-tokens", "20", "--rag-chunks-max-tokens", "40", "--rag-chunks-rate", "1e6"]
    )  # fmt: skip
    args.max_new_tokens, args.rag_question_tokens = 1, 5
    client = RecordingClient()
    extra = asyncio.run(wl_rag_chunks(Ctx(client, TokenSource(3, 100, 1000), args, None), "rag-chunks"))
    assert len(client.sent) == 30
    by_chunk: dict[tuple[int, ...], int] = {}
    system = client.sent[0][0][: args.rag_chunks_system_tokens]
    for ids, body in client.sent:
        spans = body["chunk_spans"]
        assert len(spans) == 4 and ids[: spans[0][0]] == system
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # adjacent, in order
        assert len(ids) - spans[-1][1] == args.rag_question_tokens
        for start, end in spans:
            assert 20 <= end - start <= 40
            by_chunk[tuple(ids[start:end])] = by_chunk.get(tuple(ids[start:end]), 0) + 1
    assert len(by_chunk) <= 12 and max(by_chunk.values()) > 1  # the same ids recur across questions
    assert extra["chunk_tokens"] == sum(e - s for _, b in client.sent for s, e in b["chunk_spans"])
    assert 0 < extra["chunk_tokens_in_a_prefix_seen_before"] <= extra["chunk_tokens_seen_before"]
    assert extra["real_text"] is False


def test_with_a_tokenizer_the_chunks_are_cut_from_real_text(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"[UNK]": 0, "def": 1, "self": 2}, unk_token="[UNK]")
    )
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(tmp_path)
    parser = argparse.ArgumentParser()
    ttft_bench.add_workload_args(parser)
    args = parser.parse_args(
        ["--rag-chunks-questions", "3", "--rag-chunks-catalogue", "5", "--rag-chunks-k", "2",
         "--rag-chunks-rate", "1e6", "--rag-chunks-tokenizer", str(tmp_path)]
    )  # fmt: skip
    args.max_new_tokens, args.rag_question_tokens = 1, 5
    client = RecordingClient()
    extra = asyncio.run(wl_rag_chunks(Ctx(client, TokenSource(3, 100, 1000), args, None), "rag-chunks"))
    assert extra["real_text"] is True
    chunk_ids = {i for ids, body in client.sent for start, end in body["chunk_spans"] for i in ids[start:end]}
    assert chunk_ids == {0, 1, 2}  # unknown words, and the two known ones: Python source
