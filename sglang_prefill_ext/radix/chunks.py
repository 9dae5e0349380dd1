"""The chunk store: KV slots of retrieved chunks, reused wherever a chunk recurs (docs/BLEND.md).

A chunk is keyed by its namespace and its exact token ids: a dict hashes the token bytes to find it
and compares them in full to confirm, so a hit is never a hash collision away from the wrong KV.

Entries are detached leaves of the `PrefixTree` that owns the store: `Node`s without a parent, whose
`depth` is the position of the chunk's first token when its KV was computed (its keys are rotated
for positions [depth, end)). The tree counts them in its sizes, and evicts them in the same heap and
policy order as its own leaves; a chunk goes whole (its head alone is no chunk's key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query

if TYPE_CHECKING:
    from sglang_prefill_ext.radix.tree import PrefixTree


@dataclasses.dataclass
class ChunkInsert:
    """The chunk's entry; `stored` False when it was cached already: the caller's slots stay its own."""

    entry: Node
    stored: bool


class ChunkStore:
    """Chunks of page-aligned tokens (a query's length) -> their KV slots and cached positions."""

    def __init__(self, tree: PrefixTree) -> None:
        self.tree = tree
        self._entries: dict[tuple[Hashable, bytes], Node] = {}
        self.evictable: set[Node] = set()

    def reset(self) -> None:
        """Forget every chunk (the tree was emptied; its sizes start again from zero)."""
        for entry in self._entries.values():
            entry.alive = False
        self._entries.clear()
        self.evictable.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> Iterator[Node]:
        return iter(self._entries.values())

    def _find(self, query: Query) -> tuple[tuple[Hashable, bytes], Node | None]:
        key = (query.namespace, query.tokens.tobytes())
        return key, self._entries.get(key)

    def match(self, query: Query) -> Node | None:
        """The chunk whose tokens are exactly `query`'s, marked used now; None when not cached."""
        _, entry = self._find(query)
        if entry is not None:
            self._touch(entry)
        return entry

    def insert(self, query: Query, value: Any, position: int) -> ChunkInsert:
        """Cache chunk `query` -> `value` (one slot per token, the store keeps a copy of the first
        `query.length`), computed with its first token at `position`."""
        if query.length == 0:
            raise ValueError("a chunk needs at least one page of tokens")
        if position < 0:
            raise ValueError(f"a chunk's position must be >= 0, got {position}")
        key, entry = self._find(query)
        if entry is not None:
            self._touch(entry)
            return ChunkInsert(entry, stored=False)
        tree = self.tree
        entry = Node(
            key[1], tree.values.own(value[: query.length]), None, position, query.namespace, tree.tick()
        )
        entry.hit_count = 1  # the request that computed it, as a tree leaf counts its inserter
        tree.eviction.on_new_node(entry)
        self._entries[key] = entry
        self.evictable.add(entry)
        tree.evictable_tokens += entry.size
        tree.cached_tokens += entry.size
        return ChunkInsert(entry, stored=True)

    def _touch(self, entry: Node) -> None:
        entry.last_access = self.tree.tick()
        self.tree.eviction.on_match(entry)

    def lock(self, entry: Node) -> int:
        """A request uses `entry` until `unlock`: no longer evictable. Returns the change in evictable tokens."""
        if not entry.alive:
            raise RuntimeError(f"lock of an evicted chunk: {entry}")
        self.tree.eviction.on_use(entry)
        entry.hit_count += 1
        entry.lock_ref += 1
        if entry.lock_ref > 1:
            return 0
        self.evictable.discard(entry)
        return self._shift(-entry.size)

    def unlock(self, entry: Node) -> int:
        if entry.lock_ref <= 0:
            raise RuntimeError(f"unlock of an unlocked chunk: {entry}")
        entry.lock_ref -= 1
        if entry.lock_ref:
            return 0
        self.evictable.add(entry)
        return self._shift(entry.size)

    def _shift(self, delta: int) -> int:
        """Move `delta` tokens from protected to evictable (negative: the other way)."""
        self.tree.evictable_tokens += delta
        self.tree.protected_tokens -= delta
        return delta

    def remove(self, entry: Node) -> None:
        """Drop unlocked `entry` (the tree's eviction): its slots are the caller's to free, once."""
        del self._entries[(entry.namespace, entry.tokens)]
        self.evictable.remove(entry)
        entry.alive = False
        self.tree.evictable_tokens -= entry.size
        self.tree.cached_tokens -= entry.size
