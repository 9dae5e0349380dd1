"""The chunk store beside the prefix tree of PrefillExtRadixCache, over SGLang's real KV allocators.

Requests are admitted (their cached prefix matched and locked, the chunks they reuse matched and
locked, the rest allocated, evicting when the pool is short), finish (inserted into the tree,
duplicates freed, everything unlocked); chunks are stored (slots of their own, freed again when the
chunk was cached already) and matched; the cache evicts. Every policy, pages of 1 and 4 tokens.

After every step the pool's accounting must be exact: each slot is owned exactly once (free in the
allocator, in a tree node, in a chunk, or held by a request in flight), the cache's sizes are what
its tree and chunks hold, locked or not, and the store holds exactly the chunks stored and not
evicted, with their slots and positions, hit only by their exact tokens.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402

from sglang_prefill_ext import adapters, harness  # noqa: E402
from sglang_prefill_ext.radix.eviction import POLICIES  # noqa: E402
from sglang_prefill_ext.radix.node import Node  # noqa: E402
from tests.radix.pool_slots import PoolAccounting  # noqa: E402
from tests.radix.profiles import StepCounter, machine_settings  # noqa: E402
from tests.radix.strategies import NAMESPACES, PICKS, TOKENS, grow_key  # noqa: E402

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache
POOL_TOKENS = 160
ChunkKey = tuple[Hashable, tuple[int, ...]]


class Request:
    """A request in flight: its tokens, the prefix node and chunks it locked, the slots it allocated."""

    def __init__(self, tokens: list[int], node: Node, matched: torch.Tensor, chunks: list[Node]) -> None:
        self.tokens = tokens
        self.node = node
        self.matched = matched
        self.chunks = chunks
        self.fresh = torch.empty(0, dtype=torch.int64)


class ChunkAccountingMachine(PoolAccounting, RuleBasedStateMachine):
    pool_tokens = POOL_TOKENS

    @initialize(page_size=st.sampled_from([1, 4]), policy=st.sampled_from(sorted(POLICIES)))
    def setup(self, page_size: int, policy: str) -> None:
        self.cache = PrefillExtRadixCache(HARNESS.cpu_cache_params(policy, page_size, size=POOL_TOKENS))
        self.allocator = self.cache.token_to_kv_pool_allocator
        self.store = self.cache.tree.chunks
        self.page_size = page_size
        self.keys: list[tuple[object, list[int]]] = []
        self.chunk_keys: list[tuple[object, list[int]]] = []
        self.model: dict[ChunkKey, tuple[list[int], int]] = {}  # chunk -> (slots, position)
        self.in_flight: list[Request] = []

    def _aligned(self, tokens: list[int]) -> list[int]:
        return tokens[: len(tokens) // self.page_size * self.page_size]

    def _chunk_query(self, namespace: object, tokens: list[int]):
        return self.cache.tree.query(np.array(tokens, dtype=np.int64), namespace)

    def _alloc(self, need: int) -> torch.Tensor | None:
        """`need` fresh slots, evicting first if the pool is short (None: not even then)."""
        if need == 0:
            return torch.empty(0, dtype=torch.int64)
        if self.allocator.available_size() < need:
            self._evict(need - self.allocator.available_size())
        return self.allocator.alloc(need)

    def _evict(self, num_tokens: int) -> None:
        locked = [r.chunks for r in self.in_flight]
        self.cache.evict(EvictParams(num_tokens=num_tokens))
        assert all(entry.alive for chunks in locked for entry in chunks), "a locked chunk was evicted"
        assert all(r.node is self.cache.tree.root or r.node.alive for r in self.in_flight)
        stored = {self._model_key(entry) for entry in self.store.entries()}
        assert stored <= set(self.model)
        self.model = {key: found for key, found in self.model.items() if key in stored}

    @staticmethod
    def _model_key(entry: Node) -> ChunkKey:
        return entry.namespace, tuple(np.frombuffer(entry.tokens, dtype=np.int64).tolist())

    @rule(namespace=NAMESPACES, tail=TOKENS, pick=PICKS, extend=st.booleans(), position=st.integers(0, 4096))
    def store_chunk(self, namespace: object, tail: list[int], pick: int, extend: bool, position: int) -> None:
        """An isolated prefill of a chunk (often a prefix or an extension of one stored before)."""
        namespace, tokens = grow_key(self.chunk_keys, pick, extend, namespace, tail)
        tokens = self._aligned(tokens)
        if not tokens:
            return
        slots = self._alloc(len(tokens))
        if slots is None:
            return
        outcome = self.store.insert(self._chunk_query(namespace, tokens), slots, position)
        key = (namespace, tuple(tokens))
        assert outcome.stored == (key not in self.model)
        if outcome.stored:
            self.model[key] = (slots.tolist(), position)
        else:
            self.allocator.free(slots)
        assert (outcome.entry.value.tolist(), outcome.entry.depth) == self.model[key]
        self.chunk_keys.append((namespace, tokens))
        StepCounter.count("chunks")

    def _match_chunk(self, namespace: object, tokens: list[int]) -> Node | None:
        entry = self.store.match(self._chunk_query(namespace, tokens))
        expected = self.model.get((namespace, tuple(tokens)))
        assert (entry is None) == (expected is None), "a chunk hit by tokens other than its own"
        if entry is not None:
            assert (entry.value.tolist(), entry.depth) == expected
        return entry

    @rule(namespace=NAMESPACES, tail=TOKENS, pick=PICKS, extend=st.booleans())
    def match_chunk(self, namespace: object, tail: list[int], pick: int, extend: bool) -> None:
        namespace, tokens = grow_key(self.chunk_keys, pick, extend, namespace, tail)
        if self._aligned(tokens):
            self._match_chunk(namespace, self._aligned(tokens))
        StepCounter.count("chunks")

    @rule(tail=TOKENS, pick=PICKS, extend=st.booleans(), uses=st.lists(PICKS, max_size=3))
    def admit(self, tail: list[int], pick: int, extend: bool, uses: list[int]) -> None:
        """Lock the cached prefix and the chunks the request reuses, allocate the rest."""
        _, tokens = grow_key(self.keys, pick, extend, None, tail)
        tokens = self._aligned(tokens)
        if not tokens:
            return
        match = self.cache.match_prefix(MatchPrefixParams(key=HARNESS.radix_key(tokens)))
        self.cache.inc_lock_ref(match.last_device_node)
        chunks = []
        for use in uses if self.chunk_keys else []:
            entry = self._match_chunk(*self.chunk_keys[use % len(self.chunk_keys)])
            if entry is not None:
                self.store.lock(entry)
                chunks.append(entry)
        matched = HARNESS.matched_indices(self.cache, match).to(torch.int64)
        request = Request(tokens, match.last_device_node, matched, chunks)
        self.in_flight.append(request)  # its locks hold while it waits for slots
        fresh = self._alloc(len(tokens) - len(matched))
        if fresh is None:
            self.in_flight.remove(request)
            self._release(request)
            return
        request.fresh = fresh.to(torch.int64)
        StepCounter.count("chunks")

    def _release(self, request: Request) -> None:
        self.cache.dec_lock_ref(request.node)
        for entry in request.chunks:
            self.store.unlock(entry)

    @precondition(lambda self: self.in_flight)
    @rule(pick=PICKS)
    def finish(self, pick: int) -> None:
        request = self.in_flight.pop(pick % len(self.in_flight))
        slots = torch.cat([request.matched, request.fresh])
        result = self.cache.insert(InsertParams(key=HARNESS.radix_key(request.tokens), value=slots))
        self.allocator.free(slots[len(request.matched) : result.prefix_len])
        self._release(request)
        self.keys.append((None, request.tokens))
        StepCounter.count("chunks")

    @rule(num_tokens=st.integers(0, 96))
    def evict(self, num_tokens: int) -> None:
        evictable = self.cache.evictable_size()
        available = self.allocator.available_size()
        self._evict(num_tokens)
        freed = self.allocator.available_size() - available
        assert freed >= min(num_tokens, evictable)
        StepCounter.count("chunks")

    @precondition(lambda self: not self.in_flight)
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.allocator.clear()
        self.model.clear()
        StepCounter.count("chunks")

    @invariant()
    def store_is_the_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        assert self.store.evictable == {e for e in self.store.entries() if e.lock_ref == 0}
        stored = {self._model_key(e): (e.value.tolist(), e.depth) for e in self.store.entries()}
        assert stored == self.model


ChunkAccountingMachine.TestCase.settings = machine_settings(ci_examples=300)
TestChunkAccounting = ChunkAccountingMachine.TestCase


def test_an_evicted_chunk_is_no_kv_event_block() -> None:
    """Chunks are never announced as stored blocks, so their eviction announces no removal."""
    params = HARNESS.cpu_cache_params("lru", size=16)
    params.enable_kv_cache_events = True
    cache = PrefillExtRadixCache(params)
    cache.take_events()  # the construction's AllBlocksCleared
    allocator = cache.token_to_kv_pool_allocator
    chunk = cache.tree.query(np.array([1, 2, 3], dtype=np.int64))
    cache.tree.chunks.insert(chunk, allocator.alloc(3), position=0)
    assert cache.evict(EvictParams(num_tokens=3)).num_tokens_evicted == 3
    assert allocator.available_size() == 16 and cache.take_events() == []
