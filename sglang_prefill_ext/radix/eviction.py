"""Eviction orders: SGLang's policies (same keys as its evict_policy.py) plus 'cost' and 'reuse'.

A policy maps a leaf and the tree's clocks to a sort key; the smallest key is evicted first.

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
- the last leaf taken loses only the tail that is still needed (TAIL_EVICTING): its head stays a
  usable prefix, as MIN at token granularity keeps it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from sglang_prefill_ext.radix.node import Node

# Context length at which a token's attention FLOPs roughly equal its dense (MLP + projection) FLOPs
# for 7B-70B dense models.
ATTENTION_PARITY_TOKENS = 8192


@dataclasses.dataclass(frozen=True)
class Clock:
    tick: int  # the tree's logical clock, read where RadixCache reads time.monotonic()
    uses: int  # requests cached so far
    regular: bool  # reuse intervals repeat (ReuseStats)


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


EvictionKey = Callable[[Node, Clock], Any]


def recompute_cost_per_token(node: Node) -> float:
    mean_depth = node.depth + node.size / 2
    return 1.0 + mean_depth / ATTENTION_PARITY_TOKENS


def cost_key(node: Node, now: Clock) -> tuple[float, int]:
    reuse = (1.0 + math.log2(1 + node.hit_count)) / (now.tick - node.last_access + 1)
    return (reuse * recompute_cost_per_token(node), node.last_access)


def reuse_key(node: Node, now: Clock) -> tuple[int, int]:
    if node.wanted == now.uses:
        return (1, node.last_access)
    interval = node.reuse_interval
    idle = now.uses - node.last_use
    if now.regular and interval and idle <= interval:
        probation = interval if node.hit_count <= 1 else 0
        return (0, -(node.last_use + interval + probation))
    return (0, -(now.uses + idle))


POLICIES: dict[str, EvictionKey] = {
    "lru": lambda node, now: node.last_access,
    "lfu": lambda node, now: (node.hit_count, node.last_access),
    "fifo": lambda node, now: node.created,
    "mru": lambda node, now: -node.last_access,
    "filo": lambda node, now: -node.created,
    "priority": lambda node, now: (node.priority, node.last_access),
    "slru": lambda node, now: (node.hit_count >= 2, node.last_access),
    "cost": cost_key,
    "reuse": reuse_key,
}

# Policies that split the last leaf they take at a page boundary and free only the tail still
# needed (the others free whole leaves, as RadixCache does).
TAIL_EVICTING = frozenset({"reuse"})


def eviction_key(policy: str) -> EvictionKey:
    try:
        return POLICIES[policy.lower()]
    except KeyError:
        raise ValueError(f"unknown eviction policy {policy!r}: choose from {sorted(POLICIES)}") from None
