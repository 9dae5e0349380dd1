"""A node of the prefix tree: one run of tokens, the KV slots that hold them, and bookkeeping."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

from sglang_prefill_ext.radix.tokens import TOKEN_BYTES

_ids = itertools.count()


class Node:
    """`tokens` covers absolute positions [depth, depth + size) of every key that passes through it.

    `value` is the adapter's opaque slot array for those tokens; `policy_state` belongs to the
    tree's eviction policy, `meta` to the adapter (e.g. KV-event hashes). No parent: the root, or a
    chunk store's entry (`radix.chunks`), whose tokens are the whole chunk.
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
        "policy_state",
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
        self.policy_state: Any = None
        self.alive = True
        self.id = next(_ids)
        self.meta: Any = None

    @property
    def end(self) -> int:
        return self.depth + self.size

    def key(self, page_size: int) -> Hashable:
        """Its key in its parent's children: the first page, with the namespace under the root."""
        page = self.tokens[: page_size * TOKEN_BYTES]
        return (self.namespace, page) if self.parent.parent is None else page

    def split(self, offset: int, now: int, page_size: int) -> Node:
        """Cut after `offset` tokens: a new node takes the head and this node's place under its
        parent (and its counts, priority and locks); this node keeps the tail below it. Returns the head."""
        parent = self.parent
        own_key = self.key(page_size)
        head = Node(
            self.tokens[: offset * TOKEN_BYTES],
            self.value[:offset],
            parent,
            self.depth,
            self.namespace,
            now,
            self.priority,
        )
        head.hit_count = self.hit_count
        head.lock_ref = self.lock_ref
        self.tokens = self.tokens[offset * TOKEN_BYTES :]
        self.value = self.value[offset:]
        self.depth += offset
        self.size -= offset
        self.parent = head
        parent.children[own_key] = head
        head.children[self.key(page_size)] = self
        return head

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
