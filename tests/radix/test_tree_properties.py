"""Property machine on the version-free PrefixTree against a plain reference trie."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sglang_prefill_ext.radix import MatchHandle, PrefixTree
from sglang_prefill_ext.radix.eviction import POLICIES
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

    def _aligned(self, tokens: list[int]) -> list[int]:
        return tokens[: len(tokens) // self.page_size * self.page_size]

    def _query(self, namespace: object, tokens: list[int]):
        return self.tree.query(np.array(tokens, dtype=np.int64), namespace)

    @rule(namespace=NAMESPACES, tail=TOKENS, pick=PICKS, extend=st.booleans(), priority=st.integers(0, 3))
    def insert(self, namespace: object, tail: list[int], pick: int, extend: bool, priority: int) -> None:
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        aligned = self._aligned(tokens)
        cached = len(self.model.longest_prefix(namespace, aligned))
        slots = np.arange(self.next_slot, self.next_slot + len(aligned), dtype=np.int64)
        self.next_slot += len(aligned)
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
        self.model.drop_slots(set(freed))
        StepCounter.count("tree")

    @precondition(lambda self: not self.locks)
    @rule()
    def reset(self) -> None:
        self.tree.reset()
        self.model = ReferencePrefixCache(self.page_size)
        StepCounter.count("tree")

    @invariant()
    def sizes_add_up(self) -> None:
        nodes = list(self.tree.nodes())
        total = sum(node.size for node in nodes)
        assert self.tree.evictable_tokens + self.tree.protected_tokens == self.tree.cached_tokens == total
        assert self.tree.evictable_tokens == sum(node.size for node in nodes if node.lock_ref == 0)
        assert total == self.model.size()
        assert self.tree.counters.nodes == len(nodes)

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


TreeMachine.TestCase.settings = machine_settings(ci_examples=1400)
TestTreeProperties = TreeMachine.TestCase
