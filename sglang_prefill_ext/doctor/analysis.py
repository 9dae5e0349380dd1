"""What the doctor finds in one server's requests (one log: one cache).

Requests are replayed in the order their prefill started; a request's prompt counts as in the cache
for the requests that start after its prefill ended. For each request:

- `reusable`: how far its grid blocks match a prompt already in the cache (the longest cached prefix
  an unbounded cache would give it); `hit_end`: that or its own `cached_tokens`, whichever is longer;
- a miss of the reusable prefix (`cached_tokens` short of it by a block or more) was an eviction, with
  the LRU stack distance of the prefix (distinct block tokens used since it was last used): the pool
  that would have kept it;
- `recoverable`: the tokens after `hit_end` whose content is in the cache all the same, found by grid
  blocks at the same index and anchored blocks at any offset, gaps up to `FILL_BLOCKS` blocks between
  them counted too (a block that straddles the edge of shared content never matches). They would hit
  if the prompt kept its shared content in front, in one order. The cause:
  - content found moved by a block or more: the same documents in another order (`reordered`);
  - else, content resumes at its position after the divergence: when the diverging block recurs in
    another request, a shared prefix that changed (`changed_prefix`), else content that differs in
    every request (`dynamic`).

All of it is at block granularity and assumes the cache kept what an LRU of that size would: an
estimate, which the tests hold within 5 % of the CPU replay's own counts on planted traces.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
from collections.abc import Sequence

from sglang_prefill_ext.doctor.log import Request
from sglang_prefill_ext.runner.pass_cost import PassCost

FILL_BLOCKS = 3
PATTERNS = ("dynamic", "reordered", "changed_prefix", "evicted")


@dataclasses.dataclass
class Verdict:
    """One request's diagnosis; offsets in tokens."""

    rid: str
    input_len: int
    cached: int
    reusable: int
    hit_end: int
    recoverable: int = 0
    pattern: str | None = None
    moved_from: int | None = None  # reordered: an offset its content was found at in an earlier prompt
    moved_to: int | None = None  # ... and where it sits in this one
    resumes_at: int | None = None  # dynamic / changed prefix: where the shared content resumes
    evicted: int = 0
    keep_pool: int = 0  # evicted: the LRU pool (tokens) that would have kept its prefix


class _Lru:
    """Block-token LRU stack distances: a Fenwick tree over use times holding each node's tokens at
    its last use."""

    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)

    def add(self, time: int, tokens: int) -> None:
        i = time + 1
        while i < len(self.tree):
            self.tree[i] += tokens
            i += i & -i

    def since(self, time: int) -> int:
        """Tokens of the nodes last used at `time` or later."""
        total, i = 0, len(self.tree) - 1
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        i = time
        while i > 0:
            total -= self.tree[i]
            i -= i & -i
        return total


class _Node:
    __slots__ = ("children", "used")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.used = -1


class _Cache:
    """The prompts whose prefill ended: their grid blocks as a trie (with LRU use times), and where
    each grid and anchored block was seen."""

    def __init__(self, requests: int, block: int) -> None:
        self.block = block
        self.root = _Node()
        self.lru = _Lru(requests)
        self.at_index: set[tuple[int, str]] = set()
        self.grid_index: dict[str, int] = {}
        self.anchored: dict[str, int] = {}
        self.time = 0  # inserts so far: the LRU's clock

    def prefix(self, blocks: list[str]) -> tuple[int, _Node]:
        node, depth = self.root, 0
        for h in blocks:
            child = node.children.get(h)
            if child is None:
                break
            node, depth = child, depth + 1
        return depth, node

    def insert(self, request: Request) -> None:
        fp = request.fp
        time, node = self.time, self.root
        self.time += 1
        for i, h in enumerate(fp.blocks):
            node = node.children.setdefault(h, _Node())
            if node.used >= 0:
                self.lru.add(node.used, -self.block)
            node.used = time
            self.lru.add(time, self.block)
            self.at_index.add((i, h))
            self.grid_index.setdefault(h, i)
        for offset, h in zip(fp.anchors, fp.anchored, strict=True):
            self.anchored.setdefault(h, offset)


def _covered(spans: list[tuple[int, int]], start: int, end: int, gap: int) -> int:
    """Tokens of [start, end) covered by `spans`, gaps shorter than `gap` (from `start` on) filled."""
    total, reach = 0, start
    for lo, hi in sorted(spans):
        lo, hi = max(lo, start), min(hi, end)
        if hi <= reach:
            continue
        if lo - reach < gap:
            lo = reach
        total += hi - max(lo, reach)
        reach = hi
    return total


def _diagnose(request: Request, cache: _Cache, recurring: collections.Counter) -> Verdict:
    fp = request.fp
    block = fp.block
    depth, node = cache.prefix(fp.blocks)
    reusable = min(depth * block, request.input_len)
    verdict = Verdict(request.rid, request.input_len, request.cached, reusable, max(reusable, request.cached))
    if reusable - request.cached >= block:
        verdict.pattern, verdict.evicted = "evicted", reusable - request.cached
        verdict.keep_pool = cache.lru.since(node.used)
        return verdict
    hit_end = verdict.hit_end
    spans, moved = [], None
    for i, h in enumerate(fp.blocks):
        start = i * block
        if start + block <= hit_end:
            continue
        if (i, h) in cache.at_index:
            spans.append((start, start + block))
        elif h in cache.grid_index:
            spans.append((start, start + block))
            moved = moved or (cache.grid_index[h] * block, start)
    half = block // 2
    for offset, h in zip(fp.anchors, fp.anchored, strict=True):
        seen = cache.anchored.get(h)
        if seen is None or offset + half <= hit_end:
            continue
        spans.append((offset, offset + half))
        if abs(seen - offset) >= block:
            moved = moved or (seen, offset)
    recoverable = _covered(spans, hit_end, request.input_len, FILL_BLOCKS * block)
    if recoverable < block:
        return verdict
    verdict.recoverable = recoverable
    if moved is not None:
        verdict.pattern = "reordered"
        verdict.moved_from, verdict.moved_to = moved
        return verdict
    verdict.resumes_at = min(lo for lo, hi in spans if hi > hit_end)
    diverging = hit_end // block
    recurs = diverging < len(fp.blocks) and recurring[(diverging, fp.blocks[diverging])] > 1
    verdict.pattern = "changed_prefix" if recurs else "dynamic"
    return verdict


def diagnose(requests: list[Request], flushes: Sequence[float] = ()) -> list[Verdict]:
    """The verdict of each fingerprinted request of one log, in the order their prefill started; at
    each of `flushes` (sorted) the cache starts empty."""
    requests = [r for r in requests if r.fp is not None]
    if not requests:
        return []
    block = requests[0].fp.block
    if any(r.fp.block != block for r in requests):
        raise ValueError("the log mixes fingerprint block sizes")
    recurring = collections.Counter((i, h) for r in requests for i, h in enumerate(r.fp.blocks))
    cache = _Cache(len(requests), block)
    pending: list[tuple[float, int]] = []  # (prefill end, index): prompts not in the cache yet
    flushes = list(flushes)
    verdicts = []
    for now, request in enumerate(requests):
        while flushes and flushes[0] <= request.fp.start_ms:
            flush = flushes.pop(0)
            pending = [(end, index) for end, index in pending if end > flush]  # SGLang flushes when idle
            heapq.heapify(pending)
            cache = _Cache(len(requests), block)
        while pending and pending[0][0] <= request.fp.start_ms:
            _, index = heapq.heappop(pending)
            cache.insert(requests[index])
        verdicts.append(_diagnose(request, cache, recurring))
        heapq.heappush(pending, (request.fp.end_ms, now))
    return verdicts


def saved_ms(verdict: Verdict, tokens: int, cost: PassCost) -> float:
    """GPU time the request's prefill would save with `tokens` more of its prompt cached."""
    new = verdict.input_len - verdict.cached
    tokens = min(tokens, new)
    return cost.variable_ms(new, verdict.cached) - cost.variable_ms(new - tokens, verdict.cached + tokens)
