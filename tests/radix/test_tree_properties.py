"""Property machine on the version-free PrefixTree against a plain reference trie, and on its chunk
store against a dict of the chunks stored (keys shared with the tree's: a chunk is never a prefix)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sglang_prefill_ext.radix import MatchHandle, PrefixTree
from sglang_prefill_ext.radix.eviction import POLICIES
from sglang_prefill_ext.radix.node import Node
from tests.radix.profiles import StepCounter, machine_settings
from tests.radix.reference import ReferencePrefixCache
from tests.radix.strategies import NAMESPACES, PICKS, TOKENS, grow_key


class TreeMachine(RuleBasedStateMachine):
    @initialize(
        page_size=st.sampled_from([1, 4]),
        policy=st.sampled_from(sorted(POLICIES)),
    )
    def setup(self, page_size: int, policy: str) -> None:
        self.tree = PrefixTree(page_size, policy)
        self.page_size = page_size
        self.model = ReferencePrefixCache(page_size)
        self.next_slot = 0
        self.keys: list[tuple[object, list[int]]] = []
        self.locks: list[tuple[MatchHandle, set[int]]] = []
        self.handles: dict[int, MatchHandle] = {}
        self.last_match: MatchHandle | None = None
        self.chunks: dict[tuple[object, tuple[int, ...]], tuple[list[int], int]] = {}  # -> slots, position
        self.chunk_locks: list[Node] = []
        self.last_chunk: Node | None = None

    def _aligned(self, tokens: list[int]) -> list[int]:
        return tokens[: len(tokens) // self.page_size * self.page_size]

    def _query(self, namespace: object, tokens: list[int]):
        return self.tree.query(np.array(tokens, dtype=np.int64), namespace)

    def _slots(self, count: int) -> np.ndarray:
        slots = np.arange(self.next_slot, self.next_slot + count, dtype=np.int64)
        self.next_slot += count
        return slots

    @rule(namespace=NAMESPACES, tail=TOKENS, pick=PICKS, extend=st.booleans(), priority=st.integers(0, 3))
    def insert(self, namespace: object, tail: list[int], pick: int, extend: bool, priority: int) -> None:
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        aligned = self._aligned(tokens)
        cached = len(self.model.longest_prefix(namespace, aligned))
        slots = self._slots(len(aligned))
        outcome = self.tree.insert(self._query(namespace, tokens), slots, priority)
        assert outcome.prefix_len == cached
        assert outcome.last_node.end == len(aligned)
        assert (outcome.new_leaf is None) == (cached == len(aligned))
        self.model.add(namespace, aligned, slots.tolist())
        self.keys.append((namespace, aligned))
        StepCounter.count("tree")

    @rule(
        namespace=NAMESPACES,
        tail=TOKENS,
        pick=PICKS,
        extend=st.booleans(),
        request=st.sampled_from([None, 0, 1, 2]),
    )
    def match(self, namespace: object, tail: list[int], pick: int, extend: bool, request: int | None) -> None:
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        previous = self.handles.get(request) if request is not None else None
        handle = self.tree.match(self._query(namespace, tokens), previous)
        expected = self.model.longest_prefix(namespace, self._aligned(tokens))
        assert handle.length == len(expected) == handle.node.end
        assert handle.values.tolist() == expected
        if request is not None:
            self.handles[request] = handle
        self.last_match = handle
        StepCounter.count("tree")

    @rule(namespace=NAMESPACES, tail=TOKENS, pick=PICKS, extend=st.booleans(), position=st.integers(0, 999))
    def store_chunk(self, namespace: object, tail: list[int], pick: int, extend: bool, position: int) -> None:
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        aligned = self._aligned(tokens)
        if not aligned:
            return
        outcome = self.tree.chunks.insert(self._query(namespace, tokens), self._slots(len(aligned)), position)
        key = (namespace, tuple(aligned))
        assert outcome.stored == (key not in self.chunks)
        if outcome.stored:
            self.chunks[key] = (outcome.entry.value.tolist(), position)
        assert (outcome.entry.value.tolist(), outcome.entry.depth) == self.chunks[key]
        self.keys.append((namespace, aligned))
        StepCounter.count("tree")

    @rule(namespace=NAMESPACES, tail=TOKENS, pick=PICKS, extend=st.booleans())
    def match_chunk(self, namespace: object, tail: list[int], pick: int, extend: bool) -> None:
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        entry = self.tree.chunks.match(self._query(namespace, tokens))
        expected = self.chunks.get((namespace, tuple(self._aligned(tokens))))
        found = None if entry is None else (entry.value.tolist(), entry.depth)
        assert found == expected, "a chunk hit by tokens other than its own"
        self.last_chunk = entry
        StepCounter.count("tree")

    @precondition(lambda self: self.last_chunk is not None and self.last_chunk.alive)
    @rule()
    def lock_chunk(self) -> None:
        self.tree.chunks.lock(self.last_chunk)
        self.chunk_locks.append(self.last_chunk)
        StepCounter.count("tree")

    @precondition(lambda self: self.chunk_locks)
    @rule(pick=PICKS)
    def unlock_chunk(self, pick: int) -> None:
        self.tree.chunks.unlock(self.chunk_locks.pop(pick % len(self.chunk_locks)))
        StepCounter.count("tree")

    @precondition(lambda self: self.last_match is not None and self.last_match.node.alive)
    @rule()
    def lock(self) -> None:
        handle = self.last_match
        if handle.epoch != self.tree.epoch:
            return
        self.tree.lock(handle.node)
        self.locks.append((handle, set(handle.values.tolist())))
        StepCounter.count("tree")

    @precondition(lambda self: self.locks)
    @rule(pick=PICKS)
    def unlock(self, pick: int) -> None:
        handle, _ = self.locks.pop(pick % len(self.locks))
        self.tree.unlock(handle.node)
        StepCounter.count("tree")

    @rule(num_tokens=st.integers(0, 64))
    def evict(self, num_tokens: int) -> None:
        evictable = self.tree.evictable_tokens
        evicted = self.tree.evict(num_tokens)
        freed = [slot for node in evicted for slot in node.value.tolist()]
        assert len(freed) >= min(num_tokens, evictable)
        assert len(freed) - max(node.size for node in evicted) < num_tokens if evicted else True
        locked = set().union(*(slots for _, slots in self.locks))
        assert locked.isdisjoint(freed), "a locked node was evicted"
        assert all(not node.alive for node in evicted)
        assert all(entry.alive for entry in self.chunk_locks), "a locked chunk was evicted"
        self.model.drop_slots(set(freed))
        self.chunks = {key: found for key, found in self.chunks.items() if not_evicted(found[0], freed)}
        StepCounter.count("tree")

    @precondition(lambda self: not self.locks and not self.chunk_locks)
    @rule()
    def reset(self) -> None:
        self.tree.reset()
        self.model = ReferencePrefixCache(self.page_size)
        self.chunks.clear()
        StepCounter.count("tree")

    @invariant()
    def sizes_add_up(self) -> None:
        nodes = list(self.tree.nodes())
        entries = list(self.tree.chunks.entries())
        held = nodes + entries
        total = sum(node.size for node in held)
        assert self.tree.evictable_tokens + self.tree.protected_tokens == self.tree.cached_tokens == total
        assert self.tree.evictable_tokens == sum(node.size for node in held if node.lock_ref == 0)
        assert sum(node.size for node in nodes) == self.model.size()
        assert self.tree.counters.nodes == len(nodes)
        stored = {(e.namespace, tuple(np.frombuffer(e.tokens, dtype=np.int64).tolist())): e for e in entries}
        assert {key: (e.value.tolist(), e.depth) for key, e in stored.items()} == self.chunks
        assert self.tree.chunks.evictable == {e for e in entries if e.lock_ref == 0}

    @invariant()
    def structure_is_sound(self) -> None:
        leaves = set()
        for node in self.tree.nodes():
            assert node.lock_ref >= 0
            assert node.size > 0 and node.size % self.page_size == 0
            assert node.depth % self.page_size == 0
            assert node.depth == node.parent.end
            if node.parent is not self.tree.root:
                assert node.parent.lock_ref >= node.lock_ref
            if not node.children and node.lock_ref == 0:
                leaves.add(node)
        assert leaves == self.tree.evictable_leaves


def not_evicted(slots: list[int], freed: list[int]) -> bool:
    """Whether a chunk with `slots` stays: its slots are freed all together or not at all."""
    kept = set(slots).isdisjoint(freed)
    assert kept or set(slots) <= set(freed), "part of a chunk was evicted"
    return kept


TreeMachine.TestCase.settings = machine_settings(ci_examples=1400)
TestTreeProperties = TreeMachine.TestCase
