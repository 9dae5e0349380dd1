"""The prefix tree: one walk shared by match and insert, nodes that split, lock refs, eviction.

Semantics mirror SGLang's RadixCache (what a match returns and splits, what an insert touches, which
leaves are evictable and in what order), so the adapter can be a drop-in; the speed comes from
memcmp comparisons over stored token bytes (no key slicing, no hashing) and match handles. The tree
owns a chunk store (`radix.chunks`): chunks' KV slots outside the tree's paths, counted in its sizes
and evicted in its order.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
import sys
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np

from sglang_prefill_ext.radix.chunks import ChunkStore
from sglang_prefill_ext.radix.counters import TreeCounters
from sglang_prefill_ext.radix.eviction import eviction_policy
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import common_prefix_len
from sglang_prefill_ext.radix.values import NumpyValues, ValueOps

SplitHook = Callable[[Node, Node], None]


class Reinsert(enum.Enum):
    """Whether an insert caches again what the same request cached before.

    NO: the request's use of the tree (its first complete insert): a hit on what was cached, and a
    use for the eviction policy. COUNTED: again, still a hit as SGLang counts hits (0.5.17: a
    decoding request's finish after its prefill's insert), not a new use. UNCOUNTED: again, or a
    chunk short of the prompt (SGLang's `chunked`, 0.5.23's `inserted_len`): neither.
    """

    NO = enum.auto()
    COUNTED = enum.auto()
    UNCOUNTED = enum.auto()


@dataclasses.dataclass
class InsertOutcome:
    prefix_len: int
    last_node: Node
    new_leaf: Node | None


class PrefixTree:
    """Token prefixes -> opaque slot arrays, with SGLang RadixCache's match/insert/evict semantics.

    `on_split(head, tail)` runs after a node splits, for adapters that keep per-node metadata.
    Times are a logical clock read wherever RadixCache reads `time.monotonic()`, so LRU/FIFO orders
    are the same as stock's. `eviction` is the policy (`radix.eviction`), which keeps its own
    per-node state through the hooks the tree calls. `chunks` is its chunk store: the sizes
    (`evictable_tokens`, `protected_tokens`, `cached_tokens`) count its entries too.
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
        self.eviction = eviction_policy(eviction)
        self.values = values or NumpyValues()
        self._on_split = on_split
        self.counters = TreeCounters()
        self.chunks = ChunkStore(self)
        self._clock = 0
        self.epoch = 0
        self.reset()

    # ----- state -----

    def reset(self) -> None:
        self.epoch += 1
        self.root = Node(b"", self.values.empty(), None, 0, None, self.tick(), priority=-sys.maxsize)
        self.root.lock_ref = 1
        self.evictable_leaves: set[Node] = set()
        self.chunks.reset()
        self.eviction.reset()
        self.eviction.on_new_node(self.root)
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
        access = self.tick()
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
        self, query: Query, value: Any, priority: int = 0, reinsert: Reinsert = Reinsert.NO
    ) -> InsertOutcome:
        """Cache `query` -> `value` (one slot per token); returns how much was already cached."""
        access = self.tick()
        if reinsert is Reinsert.NO:
            self.eviction.begin_use()
        node, offset = self._descend(query, self.root, 0)
        prefix_len = node.depth + offset
        partial = offset < node.size
        for matched in (node.parent if partial else node).path():
            self._mark_used(matched, access, priority, reinsert)
        self.root.last_access = access
        self.root.priority = max(self.root.priority, priority)
        if partial:
            node.last_access = access
            node = self._split(node, offset)
            node.priority = max(node.priority, priority)
            self._count_use(node, reinsert)
        new_leaf = None
        if prefix_len < query.length:
            new_leaf = self._add_leaf(node, query, prefix_len, value, priority, reinsert)
            node = new_leaf
        return InsertOutcome(prefix_len, node, new_leaf)

    def _mark_used(self, node: Node, access: int, priority: int, reinsert: Reinsert) -> None:
        node.last_access = access
        node.priority = max(node.priority, priority)
        self._count_use(node, reinsert)

    def _count_use(self, node: Node, reinsert: Reinsert) -> None:
        if reinsert is Reinsert.UNCOUNTED:
            return
        if reinsert is Reinsert.NO:
            self.eviction.on_use(node)
        node.hit_count += 1

    def _add_leaf(
        self, parent: Node, query: Query, start: int, value: Any, priority: int, reinsert: Reinsert
    ) -> Node:
        leaf = Node(
            query.tokens[start:].tobytes(),
            self.values.own(value[start:]),
            parent,
            start,
            query.namespace,
            self.tick(),
            priority,
        )
        leaf.hit_count = 0 if reinsert is Reinsert.UNCOUNTED else 1
        self.eviction.on_new_node(leaf)
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

    def touch(self, node: Node) -> None:
        """Mark `node` and its ancestors used now, as a match ending at `node` would (no split, no counts)."""
        self._touch_path(node, self.tick())

    def _touch_path(self, node: Node, access: int) -> None:
        while node is not None:
            node.last_access = access
            self.eviction.on_match(node)
            node = node.parent

    def _split(self, node: Node, offset: int) -> Node:
        """Cut `node` after `offset` tokens; the new head is returned, `node` keeps the tail."""
        head = node.split(offset, self.tick(), self.page_size)
        self.eviction.on_split(head, node)
        self.counters.nodes += 1
        self.counters.splits += 1
        if self._on_split is not None:
            self._on_split(head, node)
        return head

    def tick(self) -> int:
        """The logical clock, advanced (the tree and its chunk store read it for every access)."""
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
        """Free at least `num_tokens` (if that much is evictable): leaves and unlocked chunks, in
        policy order; the caller frees each evicted node's slots."""
        policy = self.eviction
        order = policy.order(self._clock)
        candidates = itertools.chain(self.evictable_leaves, self.chunks.evictable)
        heap = [(order(leaf), leaf.id, leaf) for leaf in candidates]
        heapq.heapify(heap)
        evicted: list[Node] = []
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            if parent is None:  # a chunk, which goes whole
                self.chunks.remove(node)
            else:
                keep = policy.kept_head(node, num_tokens - freed, self.page_size)
                if keep:
                    self._split(node, keep)  # `node` keeps the tail, which goes
                    parent = node.parent
                self._remove_leaf(node)
                if parent is not self.root and not parent.children and parent.lock_ref == 0:
                    heapq.heappush(heap, (order(parent), parent.id, parent))
            evicted.append(node)
            freed += node.size
        self.counters.evicted_tokens += freed
        return evicted

    def _remove_leaf(self, node: Node) -> None:
        parent = node.parent
        del parent.children[node.key(self.page_size)]
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
