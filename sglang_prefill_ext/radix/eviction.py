"""Eviction policies: SGLang's (same keys as its evict_policy.py) plus 'cost' and 'reuse'.

A policy orders a tree's evictable leaves (the smallest key goes first) and keeps whatever per-node
state that order needs; the tree calls its hooks when a request uses a node, when a node is made,
matched or split, and when it evicts.

'cost' keeps what is dearest to lose: a leaf's key is its expected recompute cost per freed slot,
reuse x recompute cost per token. Reuse is estimated as in hyperbolic caching (Blankstein et al.,
USENIX ATC 2017), frequency over age: `(1 + log2(1 + hits)) / (now - last_access + 1)`, the
frequency damped so a hot prefix cannot outlive a long idle spell. Recomputing a token costs its
dense FLOPs plus attention over everything before it, so a token at depth d costs
~ 1 + d / ATTENTION_PARITY_TOKENS.

"reuse" approximates Belady's MIN (drop what is needed farthest in the future) online:
- each node keeps its last reuse interval I, counted in requests cached (a new turn's leaf takes
  its parent's: it will be reused with the context it extends); a node last used at u is predicted
  back at u + I, and the farthest prediction goes first. A leaf never reused yet is on probation
  (2Q's first-time queue): predicted one interval later still. Under a loop over more context
  than fits (conversations served round-robin) this evicts the conversation served last, so the
  others stay whole and hit, where LRU evicts the one served next and misses every turn;
- only while intervals repeat (ReuseStats): on random reuse the last interval predicts nothing,
  and leaves go least recently used first, as do leaves with no interval or idle past theirs;
- leaves matched or touched since the last request was cached (waiting requests' prefixes, the
  queue's head touched last) go last: the scheduler's own knowledge of the near future wins;
- the last leaf taken loses only the tail that is still needed: its head stays a usable prefix,
  as MIN at token granularity keeps it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from sglang_prefill_ext.radix.node import Node

# Context length at which a token's attention FLOPs roughly equal its dense (MLP + projection) FLOPs
# for 7B-70B dense models.
ATTENTION_PARITY_TOKENS = 8192

LeafKey = Callable[[Node], Any]


class EvictionPolicy:
    """A leaf order and the per-node state it keeps (none here): the tree calls these hooks, and
    evicts leaves by `order` (whole ones, unless `kept_head` keeps a head)."""

    name: str

    def reset(self) -> None:
        """The tree was emptied."""

    def on_new_node(self, node: Node) -> None:
        """`node` (a new leaf, or the root) was added."""

    def begin_use(self) -> None:
        """A request starts using the tree: its insert is the one that counts for it."""

    def on_use(self, node: Node) -> None:
        """That request's insert passes `node`; called before `node.hit_count` counts it."""

    def on_match(self, node: Node) -> None:
        """A match or touch passes `node`."""

    def on_split(self, head: Node, tail: Node) -> None:
        """`head` was cut off the front of `tail`."""

    def order(self, tick: int) -> LeafKey:
        """A leaf's sort key for an eviction at the tree's logical clock `tick` (read where
        RadixCache reads time.monotonic()); the smallest goes first."""
        raise NotImplementedError

    def kept_head(self, node: Node, needed: int, page_size: int) -> int:
        """Tokens of leaf `node`'s head that may stay when only `needed` more are wanted."""
        return 0


class KeyedPolicy(EvictionPolicy):
    """An order by a key of the node's own fields (and the clock), no state of its own."""

    def __init__(self, name: str, key: Callable[[Node, int], Any]) -> None:
        self.name = name
        self._key = key

    def order(self, tick: int) -> LeafKey:
        key = self._key
        return lambda node: key(node, tick)


def recompute_cost_per_token(node: Node) -> float:
    mean_depth = node.depth + node.size / 2
    return 1.0 + mean_depth / ATTENTION_PARITY_TOKENS


def cost_key(node: Node, tick: int) -> tuple[float, int]:
    reuse = (1.0 + math.log2(1 + node.hit_count)) / (tick - node.last_access + 1)
    return (reuse * recompute_cost_per_token(node), node.last_access)


class ReuseStats:
    """How often a node's reuse interval is within a TOLERANCE-th (+1) of its previous one, as a
    moving average over the last ~WINDOW reuses. Starts at THRESHOLD, regular: a loop must be
    recognised by its first turn that does not fit, where only its first reuses have been seen. A
    loop keeps it near 1; on random reuse (two iid exponential gaps agree about 1 time in 8) the
    first disagreement takes it below THRESHOLD, and it stays below while most reuses disagree."""

    TOLERANCE = 4
    WINDOW = 16
    THRESHOLD = 0.8

    def __init__(self) -> None:
        self.agreement = self.THRESHOLD

    def observe(self, previous: int, interval: int) -> None:
        if previous:
            agree = abs(interval - previous) <= 1 + previous // self.TOLERANCE
            self.agreement += (float(agree) - self.agreement) / self.WINDOW

    def regular(self) -> bool:
        return self.agreement >= self.THRESHOLD


class ReuseState:
    """What 'reuse' keeps per node, on the policy's use clock (requests cached): the last use, the
    last gap between two uses (0: unknown) and the last match or touch."""

    __slots__ = ("last_use", "interval", "wanted")

    def __init__(self, last_use: int, interval: int, wanted: int = -1) -> None:
        self.last_use = last_use
        self.interval = interval
        self.wanted = wanted


class ReusePolicy(EvictionPolicy):
    """'reuse' (see the module doc); its per-node state is a `ReuseState` in `node.policy_state`."""

    name = "reuse"

    def __init__(self) -> None:
        self.uses = 0  # requests cached
        self.stats = ReuseStats()

    def reset(self) -> None:
        self.stats = ReuseStats()  # a flushed cache learns its next workload afresh

    def on_new_node(self, node: Node) -> None:
        parent = node.parent
        # A new turn of a conversation is reused with the prefix it extends.
        node.policy_state = ReuseState(self.uses, parent.policy_state.interval if parent else 0)

    def begin_use(self) -> None:
        self.uses += 1

    def on_use(self, node: Node) -> None:
        state = node.policy_state
        if node.hit_count:
            interval = self.uses - state.last_use
            self.stats.observe(state.interval, interval)
            state.interval = interval
        else:  # a chunk's node, used for the first time by the request that computed it
            state.interval = node.parent.policy_state.interval
        state.last_use = self.uses

    def on_match(self, node: Node) -> None:
        node.policy_state.wanted = self.uses

    def on_split(self, head: Node, tail: Node) -> None:
        state = tail.policy_state
        head.policy_state = ReuseState(state.last_use, state.interval, state.wanted)

    def order(self, tick: int) -> LeafKey:
        uses, regular = self.uses, self.stats.regular()
        return lambda node: self._reuse_key(node, uses, regular)

    @staticmethod
    def _reuse_key(node: Node, uses: int, regular: bool) -> tuple[int, int]:
        state = node.policy_state
        if state.wanted == uses:
            return (1, node.last_access)
        interval = state.interval
        idle = uses - state.last_use
        if regular and interval and idle <= interval:
            probation = interval if node.hit_count <= 1 else 0
            return (0, -(state.last_use + interval + probation))
        return (0, -(uses + idle))

    def kept_head(self, node: Node, needed: int, page_size: int) -> int:
        tail = -(-needed // page_size) * page_size
        return max(node.size - tail, 0)


STOCK_KEYS: dict[str, Callable[[Node, int], Any]] = {
    "lru": lambda node, tick: node.last_access,
    "lfu": lambda node, tick: (node.hit_count, node.last_access),
    "fifo": lambda node, tick: node.created,
    "mru": lambda node, tick: -node.last_access,
    "filo": lambda node, tick: -node.created,
    "priority": lambda node, tick: (node.priority, node.last_access),
    "slru": lambda node, tick: (node.hit_count >= 2, node.last_access),
}

# Every policy's name, each with what makes a fresh one (policies keep state: one per tree).
POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    **{name: functools.partial(KeyedPolicy, name, key) for name, key in STOCK_KEYS.items()},
    "cost": functools.partial(KeyedPolicy, "cost", cost_key),
    "reuse": ReusePolicy,
}


def eviction_policy(name: str) -> EvictionPolicy:
    """A fresh policy named `name` (any case)."""
    try:
        return POLICIES[name.lower()]()
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}: choose from {sorted(POLICIES)}") from None
