"""A node of the prefix tree: one run of tokens, the KV slots that hold them, and bookkeeping."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

from sglang_prefill_ext.radix.tokens import TOKEN_BYTES

_ids = itertools.count()


class Node:
    """`tokens` covers absolute positions [depth, depth + size) of every key that passes through it.

    `value` is the adapter's opaque slot array for those tokens; `meta` is free for the adapter
    (e.g. KV-event hashes).
    """

    __slots__ = (
        "tokens",
        "value",
        "children",
        "parent",
        "depth",
        "size",
        "namespace",
        "lock_ref",
        "hit_count",
        "priority",
        "last_access",
        "created",
        "last_use",
        "reuse_interval",
        "wanted",
        "alive",
        "id",
        "meta",
    )

    def __init__(
        self,
        tokens: bytes,
        value: Any,
        parent: Node | None,
        depth: int,
        namespace: Hashable,
        now: int,
        priority: int = 0,
    ) -> None:
        self.tokens = tokens
        self.value = value
        self.children: dict[Hashable, Node] = {}
        self.parent = parent
        self.depth = depth
        self.size = len(tokens) // TOKEN_BYTES
        self.namespace = namespace
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.last_access = now
        self.created = now
        # The tree's use clock (requests cached) at the last use, the last gap between two uses
        # (0: unknown) and at the last match or touch (see eviction.reuse_key).
        self.last_use = 0
        self.reuse_interval = 0
        self.wanted = -1
        self.alive = True
        self.id = next(_ids)
        self.meta: Any = None

    @property
    def end(self) -> int:
        return self.depth + self.size

    def path(self, stop: Node | None = None) -> list[Node]:
        """Nodes from just below `stop` (default: the root) down to self, root excluded."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not stop and node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def __repr__(self) -> str:
        return f"Node(id={self.id}, depth={self.depth}, size={self.size}, lock_ref={self.lock_ref})"
