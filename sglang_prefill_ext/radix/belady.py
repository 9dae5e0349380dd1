"""Belady's optimum for a sequence of prefix-cache accesses: the fewest prompt tokens any eviction
policy could compute, had it known the future.

The model (sequential, one request at a time, page size 1):

- access i reads `prompt` = `tokens[:prompt_len]`: the longest cached prefix of it is a hit, the
  rest is computed;
- while it runs, the whole path `tokens` (the prompt plus the output KV the server keeps,
  e.g. SGLang's prompt + output[:-1]) must be resident; after it, that path is cached;
- at most `capacity` tokens are resident at any time; what is cached is prefix-closed (a token is
  usable only with all of its ancestors), and any cached token may be dropped at any time.

Over that model the optimum is exact: it is Belady's MIN at token granularity, evicting the
resident token whose next use (the next prompt that contains it) is farthest away, the deepest
first among equals, never one of the running request's. A token's ancestors are in every prompt
it is in, so a parent's next use is never later than its child's, and this order keeps the cache
prefix-closed; MIN's exchange argument carries over because every token costs 1 to recompute and
takes 1 slot. `tests/radix/test_belady.py` checks it against exhaustive search on small cases.

For a real server it is a bound, not a schedule: a tree that evicts whole leaves can only do
worse (a leaf eviction is a set of token evictions), and so can any policy on the same sequence;
a scheduler that admits several requests at once or chunks prompts has less room (two running
paths are pinned together), so the optimum at the same pool size is at least as good as anything
it can reach.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import numpy as np

from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tree import PrefixTree

NEVER = float("inf")


@dataclasses.dataclass(frozen=True)
class Access:
    """One request: `tokens` stay cached after it, the first `prompt_len` of them are its prompt."""

    tokens: np.ndarray
    prompt_len: int

    def __post_init__(self) -> None:
        if not 0 < self.prompt_len <= len(self.tokens):
            raise ValueError(f"prompt_len {self.prompt_len} outside (0, {len(self.tokens)}]")


@dataclasses.dataclass(frozen=True)
class Optimum:
    """Per access: prompt length, reusable tokens (its prefix an earlier access left cached, i.e. in
    an earlier path) and Belady's hit."""

    prompt: list[int]
    reusable: list[int]
    hits: list[int]

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens computed: what the replay counts as prefill tokens."""
        return sum(self.prompt) - sum(self.hits)

    @property
    def recomputed_tokens(self) -> int:
        """Reusable tokens computed again: what the TTFT bench counts as recomputed."""
        return sum(self.reusable) - sum(self.hits)


def belady(accesses: Sequence[Access], capacity: int) -> Optimum:
    """Belady's optimum for `accesses` in order with `capacity` token slots (see the module doc)."""
    for i, access in enumerate(accesses):
        if len(access.tokens) > capacity:
            raise ValueError(f"access {i} needs {len(access.tokens)} resident tokens, capacity is {capacity}")
    paths, prompts = _segments(accesses)
    uses: dict[Node, list[int]] = {}
    for i, prompt in enumerate(prompts):
        for node in prompt:
            uses.setdefault(node, []).append(i)
    resident: dict[Node, int] = {}  # node -> resident tokens, its first ones
    seen: set[Node] = set()  # nodes of earlier paths
    used = 0
    hits, reusable = [], []
    for i, (path, prompt) in enumerate(zip(paths, prompts, strict=True)):
        hits.append(_resident_prefix(prompt, resident))
        reusable.append(_resident_prefix(prompt, {node: node.size for node in prompt if node in seen}))
        pinned = set(path)
        needed = sum(node.size - resident.get(node, 0) for node in path)
        excess = used + needed - capacity
        if excess > 0:
            victims = [node for node in resident if node not in pinned]
            victims.sort(key=lambda node: (_next_use(uses.get(node, ()), i), node.depth), reverse=True)
            for node in victims:
                take = min(excess, resident[node])
                resident[node] -= take
                if not resident[node]:
                    del resident[node]
                used -= take
                excess -= take
                if not excess:
                    break
        for node in path:
            resident[node] = node.size
        used += needed
        seen.update(path)
    return Optimum([a.prompt_len for a in accesses], reusable, hits)


def _segments(accesses: Sequence[Access]) -> tuple[list[list[Node]], list[list[Node]]]:
    """Each access's path and prompt as runs of a prefix tree of all of them: every path and
    prompt ends on a run boundary, so all tokens of a run are in the same paths and prompts."""
    tree = PrefixTree()
    queries = []
    for access in accesses:
        tokens = np.asarray(access.tokens, dtype=np.int64)
        whole, prompt = tree.query(tokens), tree.query(tokens[: access.prompt_len])
        for query in (whole, prompt):
            tree.insert(query, np.zeros(query.length, dtype=np.int64))
        queries.append((whole, prompt))
    return (
        [tree.match(whole).node.path() for whole, _ in queries],
        [tree.match(prompt).node.path() for _, prompt in queries],
    )


def _next_use(uses: Sequence[int], now: int) -> float:
    after = bisect.bisect_right(uses, now)
    return uses[after] if after < len(uses) else NEVER


def _resident_prefix(nodes: list[Node], resident: dict[Node, int]) -> int:
    """Tokens of the run path `nodes` resident from its start on."""
    total = 0
    for node in nodes:
        have = resident.get(node, 0)
        total += have
        if have < node.size:
            break
    return total
