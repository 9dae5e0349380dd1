"""Arrival plans the TTFT harness sends (bench/serving/workloads.py) and the CPU replay predicts
(bench/replay/capacity_replay.py) alike: when each request arrives and what it reads, drawn from a
seeded `random.Random`, without its token ids (each side makes its own).

Standard library only.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """Long unique prompts at `long_s` among short unique prompts of `short_tokens` at `short_s`."""

    long_s: tuple[float, ...]
    short_s: tuple[float, ...]
    short_tokens: tuple[int, ...]


def mixed_plan(
    rng: random.Random,
    long_n: int,
    long_every_s: float,
    short_n: int,
    short_min: int,
    short_max: int,
    short_rate: float,
) -> MixedPlan:
    """`long_n` long prompts every `long_every_s` from 0; `short_n` short ones of `short_min`..`short_max`
    tokens arriving as a Poisson process of `short_rate` per second (first arrival, then length, per short)."""
    times, lengths = [], []
    t = rng.expovariate(short_rate)
    for _ in range(short_n):
        lengths.append(rng.randint(short_min, short_max))
        times.append(t)
        t += rng.expovariate(short_rate)
    return MixedPlan(tuple(i * long_every_s for i in range(long_n)), tuple(times), tuple(lengths))


def longs_spanning(short_n: int, short_rate: float, long_every_s: float) -> int:
    """Long prompts (one every `long_every_s` from 0) over the expected span of `short_n` Poisson shorts."""
    return int(short_n / short_rate // long_every_s) + 1


@dataclasses.dataclass(frozen=True)
class MixedLoad:
    """The mixed workload's arrival rates and counts at one load factor (`mixed_plan`'s arguments)."""

    short_rate: float
    long_every_s: float
    short_n: int
    long_n: int


def mixed_load(short_rate: float, long_every_s: float, factor: float, short_n: int) -> MixedLoad:
    """Both arrival processes `factor` times faster, `short_n` shorts, long prompts spanning them."""
    rate, every = short_rate * factor, long_every_s / factor
    return MixedLoad(rate, every, short_n, longs_spanning(short_n, rate, every))


@dataclasses.dataclass(frozen=True)
class RagStreamPlan:
    """Request i arrives at `at_s[i]` and asks about document `doc[i]` (documents are numbered in the
    order they enter the catalogue)."""

    at_s: tuple[float, ...]
    doc: tuple[int, ...]

    def repeats(self) -> int:
        """Requests about a document an earlier request already read (cache hits, absent eviction)."""
        return len(self.doc) - len(set(self.doc))


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def rag_stream_plan(
    rng: random.Random, requests: int, docs: int, zipf: float, new_every: int, rate: float
) -> RagStreamPlan:
    """A catalogue of `docs` documents ranked by popularity, each request's document drawn by rank with
    Zipf(`zipf`) weights, Poisson arrivals of `rate` per second; every `new_every` requests (0: never) a
    new, cold document enters at rank 1 and the least popular one leaves, so cold documents keep arriving."""
    weights = zipf_weights(docs, zipf)
    catalogue = list(range(docs))  # rank -> document
    fresh = itertools.count(docs)
    at, doc, t = [], [], 0.0
    for i in range(requests):
        if new_every and i and i % new_every == 0:
            catalogue = [next(fresh), *catalogue[:-1]]
        doc.append(rng.choices(catalogue, weights)[0])
        at.append(t)
        t += rng.expovariate(rate)
    return RagStreamPlan(tuple(at), tuple(doc))


def rag_stream_repeating(
    rng: Callable[[], random.Random], repeats: int, docs: int, zipf: float, new_every: int, rate: float
) -> RagStreamPlan:
    """The shortest `rag_stream_plan` (from a fresh `rng()` each try) with `repeats` repeat requests; a
    plan's prefix is the plan of fewer requests, so growing it keeps the requests already drawn."""
    requests = repeats
    while (plan := rag_stream_plan(rng(), requests, docs, zipf, new_every, rate)).repeats() < repeats:
        requests += repeats - plan.repeats()
    return plan


@dataclasses.dataclass(frozen=True)
class RagChunksPlan:
    """A catalogue of chunks (`lengths[c]` tokens each) and, per question arriving at `at_s[i]`, the
    chunks it retrieved in relevance order (`retrieved[i]`)."""

    lengths: tuple[int, ...]
    at_s: tuple[float, ...]
    retrieved: tuple[tuple[int, ...], ...]

    def reuse(self) -> tuple[int, int, int]:
        """(chunk tokens sent, of them sent before in any position, of them in a prefix sent before:
        what a prefix cache can reuse at most, the chunk sequence matched up to its first difference)."""
        sent = seen_anywhere = seen_as_prefix = 0
        seen: set[int] = set()
        for chunks, depth in zip(self.retrieved, self.prefix_depths(), strict=True):
            sent += sum(self.lengths[c] for c in chunks)
            seen_anywhere += sum(self.lengths[c] for c in chunks if c in seen)
            seen_as_prefix += sum(self.lengths[c] for c in chunks[:depth])
            seen.update(chunks)
        return sent, seen_anywhere, seen_as_prefix

    def prefix_depths(self) -> Iterator[int]:
        """Per question, how many of its leading chunks an earlier question had in the same places (what a
        prefix cache matches past the system prompt)."""
        prefixes: set[tuple[int, ...]] = set()
        for chunks in self.retrieved:
            depth = 0
            while depth < len(chunks) and chunks[: depth + 1] in prefixes:
                depth += 1
            yield depth
            prefixes.update(chunks[: d + 1] for d in range(len(chunks)))


def rag_chunks_plan(
    rng: random.Random,
    questions: int,
    catalogue: int,
    k: int,
    min_tokens: int,
    max_tokens: int,
    zipf: float,
    rate: float,
) -> RagChunksPlan:
    """`catalogue` chunks of `min_tokens`..`max_tokens` tokens ranked by popularity; each question
    retrieves `k` distinct chunks, drawn one after another by Zipf(`zipf`) weight among those not yet
    drawn: the draw order is the relevance order (a popular chunk tends to rank high, not always
    first). Poisson arrivals of `rate` per second."""
    if not 0 < k <= catalogue:
        raise ValueError(f"k must be in [1, {catalogue}], got {k}")
    lengths = tuple(rng.randint(min_tokens, max_tokens) for _ in range(catalogue))
    weights = zipf_weights(catalogue, zipf)
    at, retrieved, t = [], [], 0.0
    for _ in range(questions):
        left = list(range(catalogue))
        chunks = []
        for _ in range(k):
            pick = rng.choices(range(len(left)), [weights[c] for c in left])[0]
            chunks.append(left.pop(pick))
        retrieved.append(tuple(chunks))
        at.append(t)
        t += rng.expovariate(rate)
    return RagChunksPlan(lengths, tuple(at), tuple(retrieved))


QUESTION_TOKENS = 100  # a RAG question's tokens (the bench's --rag-question-tokens)


def add_rag_chunks_args(g: Any) -> None:
    """The `rag-chunks` plan's flags, on an argparse parser or group (the bench's workloads, blend_replay)."""
    g.add_argument("--rag-chunks-questions", type=int, default=200)
    g.add_argument("--rag-chunks-catalogue", type=int, default=200, help="chunks to retrieve from")
    g.add_argument("--rag-chunks-k", type=int, default=8, help="chunks per question")
    g.add_argument("--rag-chunks-min-tokens", type=int, default=512)
    g.add_argument("--rag-chunks-max-tokens", type=int, default=2048)
    g.add_argument("--rag-chunks-zipf", type=float, default=1.0, help="popularity: Zipf exponent over ranks")
    g.add_argument("--rag-chunks-rate", type=float, default=4.0, help="Poisson arrivals per second")
    g.add_argument("--rag-chunks-system-tokens", type=int, default=256, help="shared by every question")


def rag_chunks_of(rng: random.Random, a: Any) -> RagChunksPlan:
    """The plan of `add_rag_chunks_args`' parsed flags `a`."""
    return rag_chunks_plan(
        rng,
        a.rag_chunks_questions,
        a.rag_chunks_catalogue,
        a.rag_chunks_k,
        a.rag_chunks_min_tokens,
        a.rag_chunks_max_tokens,
        a.rag_chunks_zipf,
        a.rag_chunks_rate,
    )
