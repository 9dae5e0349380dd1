"""What the doctor finds in one server's requests (one log: one cache).

Requests are replayed in the order their prefill started (`timeline`). For each request:

- `reusable`: how far its grid blocks match a prompt already in the cache (the longest cached prefix
  an unbounded cache would give it); `hit_end`: that or its own `cached_tokens`, whichever is longer;
- a miss of the reusable prefix (`cached_tokens` short of it by a block or more) was an eviction
  (`evicted`), with the LRU stack distance of the prefix (distinct block tokens used since it was last
  used): the pool that would have kept it;
- `seen`: the tokens after `hit_end` whose content is in the cache all the same, at any position (grid
  blocks at any index, anchored blocks at any offset, gaps under a block between them counted: the
  edges of shared content), for the divergence map;
- a change: the diverging block recurs in a request outside this conversation and content resumes at
  its position in a cached prompt sharing the prefix (an edit).

What each fix saves is counted by re-running the log's traffic with the fix (`layout`); the pattern
is the first fix that saves the request a block or more:
  - moving what differs per request to the end (`dynamic`): a timestamp, a profile, whatever its
    length and however far it shifts the content after it;
  - moving the change after the shared content (`changed_prefix`, a one-time cost), where the
    diagnosis found one;
  - one stable order of the shared content (`reordered`).
`non_prefix`: what the fixed layout (the change moved, for a changed prefix; else one stable order)
leaves to compute that the cache held at another position (chunks seen in other combinations, or
behind a conversation's own history): recoverable by reusing chunks at any position only.

All of it is an estimate from the fingerprints, which the tests hold within 5 % of exact re-runs of
synthesized traffic and of the CPU replay's own counts on planted traces.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from sglang_prefill_ext.doctor import layout, threads, timeline
from sglang_prefill_ext.doctor.fingerprint import WINDOW
from sglang_prefill_ext.doctor.layout import Change, Reruns
from sglang_prefill_ext.doctor.log import Request
from sglang_prefill_ext.runner.pass_cost import PassCost

PATTERNS = ("dynamic", "changed_prefix", "reordered", "evicted")
HOLDERS = 16  # the latest cached prompts remembered per block: enough to find one sharing the prefix


@dataclasses.dataclass
class Verdict:
    """One request's diagnosis; offsets in tokens."""

    rid: str
    input_len: int
    cached: int
    reusable: int
    hit_end: int
    pattern: str | None = None
    saved: int = 0  # the tokens the pattern's fix recovers
    seen: int = 0  # after hit_end, in the cache at any position
    gains: dict[str, int] = dataclasses.field(default_factory=dict)  # layout.FIXES: what each re-run adds
    non_prefix: int = 0  # seen before, recoverable by no layout fix
    moved_from: int | None = None  # an offset content after the divergence was found at in an earlier prompt
    moved_to: int | None = None  # ... and where it sits in this one
    resumes_at: int | None = None  # dynamic / changed prefix: where the shared content resumes
    change: tuple[int, str] | None = None  # changed prefix: the diverging grid block (index, hash)
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
    """The prompts whose prefill ended: their grid blocks as a trie (with LRU use times), and which
    prompts hold each grid block (at its index) and anchored block (at its offset)."""

    def __init__(self, requests: int, block: int) -> None:
        self.block = block
        self.root = _Node()
        self.lru = _Lru(requests)
        self.at_index: dict[tuple[int, str], collections.deque[int]] = {}
        self.grid_index: dict[str, int] = {}
        self.anchored: dict[str, dict[int, collections.deque[int]]] = {}
        self.time = 0  # inserts so far: the LRU's clock

    def prefix(self, blocks: list[str]) -> tuple[int, _Node]:
        node, depth = self.root, 0
        for h in blocks:
            child = node.children.get(h)
            if child is None:
                break
            node, depth = child, depth + 1
        return depth, node

    def insert(self, index: int, request: Request) -> None:
        fp = request.fp
        assert fp is not None
        time, node = self.time, self.root
        self.time += 1
        for i, h in enumerate(fp.blocks):
            node = node.children.setdefault(h, _Node())
            if node.used >= 0:
                self.lru.add(node.used, -self.block)
            node.used = time
            self.lru.add(time, self.block)
            self.at_index.setdefault((i, h), collections.deque(maxlen=HOLDERS)).append(index)
            self.grid_index.setdefault(h, i)
        for offset, h in zip(fp.anchors, fp.anchored, strict=True):
            at = self.anchored.setdefault(h, {})
            at.setdefault(offset, collections.deque(maxlen=HOLDERS)).append(index)


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


class _Log:
    """One log's requests and how they extend one another."""

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests
        self.parent = threads.parents(requests)
        self.anchors = [frozenset(r.fp.anchors) for r in requests]  # type: ignore[union-attr]
        self.holders: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
        for index, r in enumerate(requests):
            for i, h in enumerate(r.fp.blocks):  # type: ignore[union-attr]
                self.holders[(i, h)].append(index)

    def recurs_elsewhere(self, index: int, block: tuple[int, str]) -> bool:
        """Whether a request outside requests[index]'s conversation holds this grid block at its index."""
        return any(
            other != index and not threads.related(self.parent, index, other) for other in self.holders[block]
        )


def _diagnose(index: int, log: _Log, cache: _Cache) -> Verdict:
    request = log.requests[index]
    fp = request.fp
    assert fp is not None
    block = fp.block
    depth, node = cache.prefix(fp.blocks)
    reusable = min(depth * block, request.input_len)
    verdict = Verdict(request.rid, request.input_len, request.cached, reusable, max(reusable, request.cached))
    if reusable - request.cached >= block:
        verdict.pattern, verdict.saved = "evicted", reusable - request.cached
        verdict.keep_pool = cache.lru.since(node.used)
        return verdict
    hit_end = verdict.hit_end
    diverging = hit_end // block
    sharing: dict[int, bool] = {}

    def shares_prefix(holders: collections.deque[int]) -> bool:
        for other in holders:
            if other not in sharing:
                sharing[other] = log.requests[other].fp.blocks[:diverging] == fp.blocks[:diverging]  # type: ignore[union-attr]
            if sharing[other]:
                return True
        return False

    seen, in_place, moved = [], [], []  # spans: in the cache anywhere, at their offset, elsewhere only
    for i, h in enumerate(fp.blocks):
        start = i * block
        if start + block <= hit_end:
            continue
        holders = cache.at_index.get((i, h))
        if holders or h in cache.grid_index:
            seen.append((start, start + block))
        if holders and shares_prefix(holders):
            in_place.append((start, start + block))
        elif not holders and h in cache.grid_index:
            moved.append((start, cache.grid_index[h] * block))
    half = block // 2
    mine: dict[str, int] = {}
    # the last anchored block seen (offset, where its holders have it), and whether an anchor since
    # starts content new to them (a window neither of them holds at that distance)
    last: tuple[int, list[tuple[int, int]]] | None = None
    new_since = False
    for offset, h in zip(fp.anchors, fp.anchored, strict=True):
        first_here = mine.setdefault(h, offset)
        at = cache.anchored.get(h)
        if offset + half <= hit_end:
            continue
        if not at:
            if last is None:
                continue
            if not new_since and any(
                there + offset - last[0] in log.anchors[holder] for there, holder in last[1]
            ):
                seen.append((last[0], offset + WINDOW))  # its window still the content seen before it
            else:
                new_since = True
            continue
        seen.append((offset, offset + half))
        if last is not None and (
            not new_since or any(there + offset - last[0] in at for there, _ in last[1])
        ):  # old content on both sides of the gap, nothing new in it: the gap is old content too
            seen.append((last[0], offset))
        last = (offset, [(there, holders[-1]) for there, holders in at.items()][:HOLDERS])
        new_since = False
        if offset in at and shares_prefix(at[offset]):
            in_place.append((offset, offset + half))
        elif offset not in at and first_here == offset:  # a repeat within the prompt is not a move
            moved.append((offset, min(at)))
    if moved:
        verdict.moved_to, verdict.moved_from = min(moved)
    verdict.seen = _covered(seen, hit_end, request.input_len, block)
    change = (diverging, fp.blocks[diverging]) if diverging < len(fp.blocks) else None
    if (
        in_place
        and min(lo for lo, _ in in_place) <= min((to for to, _ in moved), default=request.input_len)
        and change is not None
        and log.recurs_elsewhere(index, change)
    ):  # new content, then what the prompt it changed holds, at its offset: a change, if its re-run saves
        verdict.resumes_at = min(lo for lo, _ in in_place)
        verdict.change = change
    else:
        verdict.resumes_at = min((lo for lo, hi in seen if hi > hit_end), default=None)
    return verdict


def _settle(verdict: Verdict, gains: dict[str, int], block: int) -> None:
    """The verdict's pattern: the first fix whose re-run saves it a block or more (`layout.FIXES`
    order; a changed prefix only where the diagnosis found the change)."""
    verdict.gains = gains
    if verdict.pattern == "evicted":
        return
    if verdict.change is None:
        gains = {**gains, "changed_prefix": 0}
    verdict.pattern = next((fix for fix in layout.FIXES if gains[fix] >= block), None)
    verdict.saved = gains[verdict.pattern] if verdict.pattern is not None else 0
    if verdict.pattern != "changed_prefix":
        verdict.change = None
    if verdict.pattern not in ("dynamic", "changed_prefix"):
        verdict.resumes_at = None


def diagnose(requests: list[Request], flushes: Sequence[float] = ()) -> list[Verdict]:
    """The verdict of each fingerprinted request of one log, in the order their prefill started; at
    each of `flushes` (sorted) the cache starts empty."""
    requests = [r for r in requests if r.fp is not None]
    if not requests:
        return []
    block = requests[0].fp.block
    if any(r.fp.block != block for r in requests):
        raise ValueError("the log mixes fingerprint block sizes")
    log = _Log(requests)
    cache = _Cache(len(requests), block)
    verdicts = []
    for event, index in timeline.events(requests, flushes):
        if event == "flush":
            cache = _Cache(len(requests), block)
        elif event == "cache":
            cache.insert(index, requests[index])
        else:
            verdicts.append(_diagnose(index, log, cache))
    reruns = Reruns(requests, flushes, log.parent, [v.hit_end for v in verdicts])
    changed, changed_elsewhere = reruns.changed(
        [
            Change(i, v.hit_end, v.resumes_at)  # type: ignore[arg-type]
            for i, v in enumerate(verdicts)
            if v.change is not None and reruns.dynamic[i] < block
        ]
    )
    for i, v in enumerate(verdicts):
        gains = (reruns.dynamic[i], changed[i], reruns.reordered[i])
        _settle(v, dict(zip(layout.FIXES, gains, strict=True)), block)
        v.non_prefix = changed_elsewhere[i] if v.pattern == "changed_prefix" else reruns.non_prefix[i]
    return verdicts


def saved_ms(verdict: Verdict, tokens: int, cost: PassCost) -> float:
    """GPU time the request's prefill would save with `tokens` more of its prompt cached."""
    new = verdict.input_len - verdict.cached
    tokens = min(tokens, new)
    return cost.variable_ms(new, verdict.cached) - cost.variable_ms(new - tokens, verdict.cached + tokens)
