"""The prefix tree: one walk shared by match and insert, nodes that split, lock refs, eviction.

Semantics mirror SGLang's RadixCache (what a match returns and splits, what an insert touches, which
leaves are evictable and in what order), so the adapter can be a drop-in; the speed comes from
memcmp comparisons over stored token bytes (no key slicing, no hashing) and match handles.
"""

from __future__ import annotations

import dataclasses
import heapq
import sys
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np

from sglang_prefill_ext.radix.counters import TreeCounters
from sglang_prefill_ext.radix.eviction import TAIL_EVICTING, Clock, ReuseStats, eviction_key
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import TOKEN_BYTES, common_prefix_len
from sglang_prefill_ext.radix.values import NumpyValues, ValueOps

SplitHook = Callable[[Node, Node], None]


@dataclasses.dataclass
class InsertOutcome:
    prefix_len: int
    last_node: Node
    new_leaf: Node | None


class PrefixTree:
    """Token prefixes -> opaque slot arrays, with SGLang RadixCache's match/insert/evict semantics.

    `on_split(prefix, tail)` runs after a node splits, for adapters that keep per-node metadata.
    Times are a logical clock read wherever RadixCache reads `time.monotonic()`, so LRU/FIFO orders
    are the same as stock's.
    """

    def __init__(
        self,
        page_size: int = 1,
        eviction: str = "lru",
        values: ValueOps | None = None,
        on_split: SplitHook | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.eviction = eviction.lower()
        self._eviction_key = eviction_key(self.eviction)
        self._evict_tails = self.eviction in TAIL_EVICTING
        self.values = values or NumpyValues()
        self._on_split = on_split
        self.counters = TreeCounters()
        self._clock = 0
        self.uses = 0  # requests cached (inserts that are not a request's own re-insert)
        self.epoch = 0
        self.reset()

    # ----- state -----

    def reset(self) -> None:
        self.epoch += 1
        self.root = Node(b"", self.values.empty(), None, 0, None, self._tick(), priority=-sys.maxsize)
        self.root.lock_ref = 1
        self.evictable_leaves: set[Node] = set()
        self.reuse_stats = ReuseStats()  # a flushed cache learns its next workload afresh
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.cached_tokens = 0
        self.counters.nodes = 0

    def query(self, tokens: np.ndarray, namespace: Hashable = None) -> Query:
        return Query(tokens, namespace, self.page_size)

    def nodes(self) -> Iterator[Node]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ----- match -----

    def match(self, query: Query, handle: MatchHandle | None = None) -> MatchHandle:
        """Longest cached prefix of `query`; extends `handle` (a previous match) when still valid."""
        access = self._tick()
        resume = self._resume_point(query, handle)
        if resume is None:
            base_node, base_len, base_values = self.root, 0, None
            node, offset = self.root, 0
        else:
            node, offset = resume
            base_len = node.depth + offset
            base_node = handle.node if base_len == handle.length else None
            base_values = handle.values if base_node is not None else handle.values[:base_len]
            self.counters.rematches += 1
        node, offset = self._descend(query, node, offset)
        self._touch_path(node, access)
        last = node if offset == node.size else self._split(node, offset)
        values = self._joined_values(last, base_node, base_len, base_values)
        if resume is None:
            self.counters.hit_tokens += last.end
            self.counters.missed_tokens += query.length - last.end
        return MatchHandle(last, last.end, values, query.namespace, self.epoch)

    def _resume_point(self, query: Query, handle: MatchHandle | None) -> tuple[Node, int] | None:
        if (
            handle is None
            or handle.epoch != self.epoch
            or not handle.node.alive
            or handle.namespace != query.namespace
        ):
            return None
        node, length = handle.node, min(handle.length, query.length)
        while node is not self.root and node.depth >= length:
            node = node.parent
        if length and not self._verified(query, node, length):
            return None
        return node, length - node.depth

    def _joined_values(self, last: Node, base_node: Node | None, base_len: int, base_values: Any) -> Any:
        if last.end == base_len and base_values is not None:
            return base_values
        parts = [n.value for n in last.path(stop=base_node)]
        if base_values is not None:
            parts.insert(0, base_values)
        return self.values.join(parts) if parts else self.values.empty()

    # ----- insert -----

    def insert(
        self, query: Query, value: Any, priority: int = 0, chunked: bool = False, repeat: bool = False
    ) -> InsertOutcome:
        """Cache `query` -> `value` (one slot per token); returns how much was already cached.

        `chunked`: a chunked request caching a chunk (no hit, no use). `repeat`: a request caching
        again what it cached before (a decoding request's finish after its prefill's insert): a hit as
        SGLang counts hits, but not a new use for the reuse intervals."""
        access = self._tick()
        self.uses += 0 if chunked or repeat else 1
        node, offset = self._descend(query, self.root, 0)
        prefix_len = node.depth + offset
        partial = offset < node.size
        for matched in (node.parent if partial else node).path():
            self._mark_used(matched, access, priority, chunked, repeat)
        self.root.last_access = access
        self.root.priority = max(self.root.priority, priority)
        if partial:
            node.last_access = access
            node = self._split(node, offset)
            node.priority = max(node.priority, priority)
            self._count_use(node, chunked, repeat)
        new_leaf = None
        if prefix_len < query.length:
            new_leaf = self._add_leaf(node, query, prefix_len, value, priority, chunked)
            node = new_leaf
        return InsertOutcome(prefix_len, node, new_leaf)

    def _mark_used(self, node: Node, access: int, priority: int, chunked: bool, repeat: bool) -> None:
        node.last_access = access
        node.priority = max(node.priority, priority)
        self._count_use(node, chunked, repeat)

    def _count_use(self, node: Node, chunked: bool, repeat: bool) -> None:
        # A chunked request re-inserting its own earlier chunks is not a reuse.
        if chunked:
            return
        if not repeat:
            if node.hit_count:
                interval = self.uses - node.last_use
                self.reuse_stats.observe(node.reuse_interval, interval)
                node.reuse_interval = interval
            else:  # a chunk's node, used for the first time by the request that computed it
                node.reuse_interval = node.parent.reuse_interval
            node.last_use = self.uses
        node.hit_count += 1

    def _add_leaf(
        self, parent: Node, query: Query, start: int, value: Any, priority: int, chunked: bool
    ) -> Node:
        leaf = Node(
            query.tokens[start:].tobytes(),
            self.values.own(value[start:]),
            parent,
            start,
            query.namespace,
            self._tick(),
            priority,
        )
        leaf.hit_count = 0 if chunked else 1
        leaf.last_use = self.uses
        # A new turn of a conversation is reused with the prefix it extends.
        leaf.reuse_interval = parent.reuse_interval
        parent.children[self._child_key(parent, query, start)] = leaf
        self.evictable_tokens += leaf.size
        self.cached_tokens += leaf.size
        self.counters.nodes += 1
        self.counters.inserted_tokens += leaf.size
        self._refresh_leaf(parent)
        self._refresh_leaf(leaf)
        return leaf

    # ----- the shared walk -----

    def _verified(self, query: Query, node: Node, position: int) -> bool:
        """query.tokens[:position] equals the stored path ending `position - node.depth` into `node`."""
        tokens = query.tokens
        if node.namespace != query.namespace or not node.tokens.startswith(tokens[node.depth : position]):
            return False
        node = node.parent
        while node is not self.root:
            # Same length on both sides, so startswith is equality.
            if not node.tokens.startswith(tokens[node.depth : node.end]):
                return False
            node = node.parent
        return True

    def _descend(self, query: Query, node: Node, offset: int) -> tuple[Node, int]:
        """Walk down from `offset` tokens into `node` while the query matches; (node, offset) at the end."""
        tokens, length, page = query.tokens, query.length, self.page_size
        position = node.depth + offset
        while True:
            if offset < node.size:
                limit = min(node.size - offset, length - position)
                same = common_prefix_len(node.tokens, offset, tokens[position : position + limit], limit)
                same -= same % page
                offset += same
                position += same
                if offset < node.size:
                    return node, offset
            if position == length:
                return node, offset
            child = node.children.get(self._child_key(node, query, position))
            if child is None:
                return node, offset
            node, offset = child, 0

    def _child_key(self, parent: Node, query: Query, position: int) -> Hashable:
        page = query.page_key(position, self.page_size)
        return (query.namespace, page) if parent is self.root else page

    def _own_key(self, node: Node) -> Hashable:
        page = node.tokens[: self.page_size * TOKEN_BYTES]
        return (node.namespace, page) if node.parent is self.root else page

    def touch(self, node: Node) -> None:
        """Mark `node` and its ancestors used now, as a match ending at `node` would (no split, no counts)."""
        self._touch_path(node, self._tick())

    def _touch_path(self, node: Node, access: int) -> None:
        while node is not None:
            node.last_access = access
            node.wanted = self.uses
            node = node.parent

    def _split(self, node: Node, offset: int) -> Node:
        """Cut `node` after `offset` tokens; the new upper half is returned, `node` keeps the rest."""
        key = self._own_key(node)
        parent = node.parent
        prefix = Node(
            node.tokens[: offset * TOKEN_BYTES],
            node.value[:offset],
            parent,
            node.depth,
            node.namespace,
            self._tick(),
            node.priority,
        )
        prefix.hit_count = node.hit_count
        prefix.last_use = node.last_use
        prefix.reuse_interval = node.reuse_interval
        prefix.wanted = node.wanted
        prefix.lock_ref = node.lock_ref
        node.tokens = node.tokens[offset * TOKEN_BYTES :]
        node.value = node.value[offset:]
        node.depth += offset
        node.size -= offset
        node.parent = prefix
        parent.children[key] = prefix
        prefix.children[self._own_key(node)] = node
        self.counters.nodes += 1
        self.counters.splits += 1
        if self._on_split is not None:
            self._on_split(prefix, node)
        return prefix

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ----- locks and eviction -----

    def lock(self, node: Node) -> int:
        """Protect `node` and its ancestors from eviction; returns the change in evictable tokens."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                delta -= node.size
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            node = node.parent
        self.evictable_tokens += delta
        self.protected_tokens -= delta
        return delta

    def unlock(self, node: Node) -> int:
        delta = 0
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of an unlocked node: {node}")
            if node.lock_ref == 1:
                delta += node.size
            node.lock_ref -= 1
            self._refresh_leaf(node)
            node = node.parent
        self.evictable_tokens += delta
        self.protected_tokens -= delta
        return delta

    def evict(self, num_tokens: int) -> list[Node]:
        """Free at least `num_tokens` (if that much is evictable), leaves first, in policy order."""
        order, now = self._eviction_key, Clock(self._clock, self.uses, self.reuse_stats.regular())
        heap = [(order(leaf, now), leaf.id, leaf) for leaf in self.evictable_leaves]
        heapq.heapify(heap)
        evicted: list[Node] = []
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            keep = self._kept_head(node, num_tokens - freed)
            if keep:
                self._split(node, keep)  # `node` keeps the tail, which goes
            self._remove_leaf(node)
            evicted.append(node)
            freed += node.size
            parent = node.parent
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (order(parent, now), parent.id, parent))
        self.counters.evicted_tokens += freed
        return evicted

    def _kept_head(self, node: Node, needed: int) -> int:
        """Tokens of a leaf's head that can stay when only `needed` are wanted (tail-evicting
        policies; the others evict whole leaves, as RadixCache does)."""
        if not self._evict_tails:
            return 0
        tail = -(-needed // self.page_size) * self.page_size
        return max(node.size - tail, 0)

    def _remove_leaf(self, node: Node) -> None:
        parent = node.parent
        del parent.children[self._own_key(node)]
        self.evictable_tokens -= node.size
        self.cached_tokens -= node.size
        self.evictable_leaves.discard(node)
        node.alive = False
        self.counters.nodes -= 1
        self._refresh_leaf(parent)

    def _refresh_leaf(self, node: Node) -> None:
        if node.lock_ref > 0 or node.children or node is self.root:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)
