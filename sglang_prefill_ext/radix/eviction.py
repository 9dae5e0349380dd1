"""Eviction orders: SGLang's policies (same keys as its evict_policy.py) plus 'cost'.

A policy maps a leaf and the tree's logical clock to a sort key; the smallest key is evicted first.

'cost' keeps what is dearest to lose: a leaf's key is its expected recompute cost per freed slot,
reuse x recompute cost per token. Reuse is estimated as in hyperbolic caching (Blankstein et al.,
USENIX ATC 2017), frequency over age: `(1 + log2(1 + hits)) / (now - last_access + 1)`, the
frequency damped so a hot prefix cannot outlive a long idle spell. Recomputing a token costs its
dense FLOPs plus attention over everything before it, so a token at depth d costs
~ 1 + d / ATTENTION_PARITY_TOKENS.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sglang_prefill_ext.radix.node import Node

# Context length at which a token's attention FLOPs roughly equal its dense (MLP + projection) FLOPs
# for 7B-70B dense models.
ATTENTION_PARITY_TOKENS = 8192

EvictionKey = Callable[[Node, int], Any]


def recompute_cost_per_token(node: Node) -> float:
    mean_depth = node.depth + node.size / 2
    return 1.0 + mean_depth / ATTENTION_PARITY_TOKENS


def cost_key(node: Node, now: int) -> tuple[float, int]:
    reuse = (1.0 + math.log2(1 + node.hit_count)) / (now - node.last_access + 1)
    return (reuse * recompute_cost_per_token(node), node.last_access)


POLICIES: dict[str, EvictionKey] = {
    "lru": lambda node, now: node.last_access,
    "lfu": lambda node, now: (node.hit_count, node.last_access),
    "fifo": lambda node, now: node.created,
    "mru": lambda node, now: -node.last_access,
    "filo": lambda node, now: -node.created,
    "priority": lambda node, now: (node.priority, node.last_access),
    "cost": cost_key,
}


def eviction_key(policy: str) -> EvictionKey:
    try:
        return POLICIES[policy.lower()]
    except KeyError:
        raise ValueError(f"unknown eviction policy {policy!r}: choose from {sorted(POLICIES)}") from None
