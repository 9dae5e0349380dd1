"""A blended request's prefill as ordinary extends over the blended KV (docs/BLEND.md, the serving plan).

Under the fixed rule (`select.fixed_ratio`) the tokens a request computes are contiguous runs: the
text between chunks, each reused chunk's head (its first ceil(ratio * n) tokens: past the tree's
match, where it holds a chunk's head already), the first token past the match, and the tail of a
chunk shorter than a page. Between two runs lies a reused run, whose KV comes from the store (K
re-rotated, V copied). Attention is causal, so a computed row never reads a later row: running the
computed runs one after another, each as a plain extend whose prefix is every earlier slot (reused
or computed), gives the very KV and logits of the one-pass blended prefill (tests/blend/test_plan.py).
That is what lets the server run blending on stock extend kernels: in one forward pass, one batch
entry per computed run over the request's slots (the backend writes each entry's KV before it
attends, causal at each entry's end), or, where that cannot run, one pass per computed run after a
reused one (up to one per reused chunk, plus the last).

`lookups` says which spans the chunk store is asked about (those past the prefix-tree match with at
least a page of tokens, keyed by their page-aligned head); `plan` turns the answers into runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from sglang_prefill_ext.blend.select import check_ratio
from sglang_prefill_ext.blend.spans import Span


@dataclasses.dataclass(frozen=True)
class Lookup:
    """Span `index`'s store key: its tokens [start, start + length), `length` its page-aligned head."""

    index: int
    start: int
    length: int


@dataclasses.dataclass(frozen=True)
class Run:
    """Prompt positions [start, end): computed when `cached_start` is None, else reused from the store
    entry of span `span`, whose token at `start` was cached at position `cached_start`."""

    start: int
    end: int
    span: int | None = None
    cached_start: int | None = None

    @property
    def reused(self) -> bool:
        return self.cached_start is not None


@dataclasses.dataclass(frozen=True)
class BlendCounts:
    """What a plan does with the chunk tokens past the tree's match (a request's log line): of
    `chunk_tokens` marked there, `reused_tokens` come from the store, `recomputed_tokens` are computed
    in the `hits` chunks that reuse the rest (their heads past the match, and the prompt's last
    token), and the others, of chunks the store missed or a plan computes whole, are computed."""

    chunk_tokens: int
    hits: int
    reused_tokens: int
    recomputed_tokens: int


@dataclasses.dataclass(frozen=True)
class BlendPlan:
    """The positions past the tree's match, in runs; `stores`: the looked-up spans that missed, to be
    stored once computed; `exact_len`: how far the prompt's KV is exact (what the tree may take)."""

    prefix_len: int
    runs: tuple[Run, ...]
    stores: tuple[Lookup, ...]
    exact_len: int

    @property
    def reused_tokens(self) -> int:
        return sum(run.end - run.start for run in self.runs if run.reused)

    @property
    def extends(self) -> tuple[Run, ...]:
        """The computed runs, in order: the one pass's batch entries (every reused run written first),
        or one forward pass each (the reused run before each written first)."""
        return tuple(run for run in self.runs if not run.reused)

    def counts(self, spans: tuple[Span, ...]) -> BlendCounts:
        """The plan's `BlendCounts` for the prompt's `spans`."""
        reused = [run for run in self.runs if run.reused]
        hit_spans = {run.span for run in reused}
        hit_tokens = sum(spans[i][1] - max(spans[i][0], self.prefix_len) for i in hit_spans)  # type: ignore[index]
        return BlendCounts(
            chunk_tokens=sum(max(end - max(start, self.prefix_len), 0) for start, end in spans),
            hits=len(hit_spans),
            reused_tokens=self.reused_tokens,
            recomputed_tokens=hit_tokens - self.reused_tokens,
        )

    def computed_from(self, position: int) -> BlendPlan:
        """This plan with everything from `position` (a run's start) on computed instead."""
        runs = (*(run for run in self.runs if run.end <= position), Run(position, self.runs[-1].end))
        first_reused = next((run.start for run in runs if run.reused), runs[-1].end)
        return dataclasses.replace(self, runs=runs, exact_len=first_reused)


def lookups(spans: tuple[Span, ...], prefix_len: int, page_size: int) -> tuple[Lookup, ...]:
    """The spans to look up: not wholly in the matched prefix, with at least one page of tokens. A
    span the match ends in (its head in the tree from an earlier blended request) reuses past it."""
    found = []
    for index, (start, end) in enumerate(spans):
        length = (end - start) // page_size * page_size
        if end > prefix_len and length:
            found.append(Lookup(index, start, length))
    return tuple(found)


def plan(
    prompt_len: int,
    prefix_len: int,
    spans: tuple[Span, ...],
    asked: tuple[Lookup, ...],
    hits: Mapping[int, int],
    ratio: float,
) -> BlendPlan:
    """The runs of a prompt whose first `prefix_len` tokens the tree matched. `asked` is `lookups`'s
    answer; `hits` maps the index of each span found in the store to its entry's cached position."""
    check_ratio(ratio)
    if not 0 <= prefix_len < prompt_len:
        raise ValueError(
            f"the matched prefix ({prefix_len}) must leave a token of the {prompt_len} to compute"
        )
    runs: list[Run] = []
    cursor = prefix_len
    for lookup in asked:
        if lookup.index not in hits:
            continue
        start, end = spans[lookup.index]
        head = math.ceil(ratio * (end - start))
        # the prompt's last token is always computed: its logits are the first output token
        reuse_end = min(start + lookup.length, prompt_len - 1)
        # the first run is computed: a server's first extend starts the request (no slots before it)
        reuse_start = max(start + head, cursor + (not runs))
        if reuse_start >= reuse_end:
            continue
        if cursor < reuse_start:
            runs.append(Run(cursor, reuse_start))
        offset = hits[lookup.index] - start
        runs.append(Run(reuse_start, reuse_end, lookup.index, reuse_start + offset))
        cursor = reuse_end
    runs.append(Run(cursor, prompt_len))
    first_reused = next((run.start for run in runs if run.reused), prompt_len)
    stores = tuple(lookup for lookup in asked if lookup.index not in hits)
    return BlendPlan(prefix_len, tuple(runs), stores, first_reused)
