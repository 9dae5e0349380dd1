"""Eviction orders: SGLang's policies (same keys as its evict_policy.py) plus 'cost'.

A policy maps a node to a sort key; the smallest key is evicted first.

'cost' is GDSF-like: a node's key is `cost_base + (hits + 1) * recompute cost per token`, where
`cost_base` is the tree's inflation clock at the node's last access (recency) and the clock rises to
the key of each evicted node (aging). Recomputing a token costs its dense FLOPs plus attention over
everything before it, so a token at depth d costs ~ 1 + d / ATTENTION_PARITY_TOKENS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_prefill_ext.radix.node import Node

# Context length at which a token's attention FLOPs roughly equal its dense (MLP + projection) FLOPs
# for 7B-70B dense models.
ATTENTION_PARITY_TOKENS = 8192

EvictionKey = Callable[[Node], Any]


def recompute_cost_per_token(node: Node) -> float:
    mean_depth = node.depth + node.size / 2
    return 1.0 + mean_depth / ATTENTION_PARITY_TOKENS


def cost_key(node: Node) -> tuple[float, int]:
    return (node.cost_base + (node.hit_count + 1) * recompute_cost_per_token(node), node.last_access)


POLICIES: dict[str, EvictionKey] = {
    "lru": lambda node: node.last_access,
    "lfu": lambda node: (node.hit_count, node.last_access),
    "fifo": lambda node: node.created,
    "mru": lambda node: -node.last_access,
    "filo": lambda node: -node.created,
    "priority": lambda node: (node.priority, node.last_access),
    "cost": cost_key,
}


def eviction_key(policy: str) -> EvictionKey:
    try:
        return POLICIES[policy.lower()]
    except KeyError:
        raise ValueError(f"unknown eviction policy {policy!r}: choose from {sorted(POLICIES)}") from None
