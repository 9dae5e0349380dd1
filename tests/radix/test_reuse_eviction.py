"""The 'reuse' policy on PrefillExtRadixCache over SGLang's real KV allocators, as a scheduler drives
it: requests are admitted (prefix matched and locked, the rest allocated, evicting when the pool is
short), run (in flight, holding their slots), finish (inserted, duplicates freed, unlocked), or
wait (matched and touched each pass). Eviction must never free a slot of a locked prefix or of a
request in flight, must free only what was asked rounded up to a page, and every slot of the pool
must stay owned exactly once: free in the allocator, cached in the tree or held by a request.
Then its order on the version-free tree: a loop, and the switch to least recently used."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

from sglang_prefill_ext import adapters, harness  # noqa: E402
from sglang_prefill_ext.radix import PrefixTree  # noqa: E402
from sglang_prefill_ext.radix.eviction import ReuseStats  # noqa: E402
from tests.radix.profiles import StepCounter, machine_settings  # noqa: E402
from tests.radix.strategies import PICKS, TOKENS, grow_key  # noqa: E402

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache
POOL_TOKENS = 128


class Request:
    """A request's identity (match handles are keyed on it) and, once admitted, what it holds."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.node = None
        self.slots = torch.empty(0, dtype=torch.int64)
        self.matched = 0


class ReuseEvictionMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 4]))
    def setup(self, page_size: int) -> None:
        if page_size == 1:
            allocator = TokenToKVPoolAllocator(POOL_TOKENS, torch.int64, "cpu", None, need_sort=False)
        else:
            allocator = PagedTokenToKVPoolAllocator(
                POOL_TOKENS, page_size, torch.int64, "cpu", None, need_sort=False
            )
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=allocator,
            page_size=page_size,
            eviction_policy="reuse",
        )
        self.cache = PrefillExtRadixCache(params)
        self.allocator = allocator
        self.page_size = page_size
        self.keys: list[tuple[object, list[int]]] = []
        self.in_flight: list[Request] = []
        self.waiting: list[Request] = []

    def _key(self, tokens: list[int]) -> object:
        return HARNESS.radix_key(tokens)

    def _new_request(self, tail: list[int], pick: int, extend: bool) -> Request:
        _, tokens = grow_key(self.keys, pick, extend, None, tail)
        return Request(tokens[: len(tokens) // self.page_size * self.page_size])

    def _locked_slots(self) -> set[int]:
        held = [r.slots for r in self.in_flight]
        return set(torch.cat(held).tolist()) if held else set()

    def _evict(self, num_tokens: int) -> None:
        locked = self._locked_slots()
        evictable = self.cache.evictable_size()
        before = set(self.allocator.free_pages.tolist())
        evicted = self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
        pages = set(self.allocator.free_pages.tolist()) - before
        freed = (
            {p * self.page_size + i for p in pages for i in range(self.page_size)}
            if self.page_size > 1
            else pages
        )
        assert len(freed) == evicted
        assert freed.isdisjoint(locked), "a slot of a locked prefix or of a request in flight was evicted"
        assert evicted >= min(num_tokens, evictable)
        assert evicted < max(num_tokens, 1) + self.page_size, "more than the tail that was asked for"

    @rule(tail=TOKENS, pick=PICKS, extend=st.booleans())
    def admit(self, tail: list[int], pick: int, extend: bool) -> None:
        """Match and lock the prefix, evict for the rest if the pool is short, allocate it."""
        request = self.waiting.pop(pick % len(self.waiting)) if self.waiting and extend else None
        request = request or self._new_request(tail, pick, extend)
        if not request.tokens:
            return
        match = self.cache.match_prefix(MatchPrefixParams(key=self._key(request.tokens), req=request))
        matched = HARNESS.matched_indices(self.cache, match)
        self.cache.inc_lock_ref(match.last_device_node)
        need = len(request.tokens) - len(matched)
        if self.allocator.available_size() < need:
            self._evict(need - self.allocator.available_size())
        fresh = self.allocator.alloc(need) if need else torch.empty(0, dtype=torch.int64)
        if fresh is None:
            self.cache.dec_lock_ref(match.last_device_node)
            return
        request.node, request.matched = match.last_device_node, len(matched)
        request.slots = torch.cat([matched.to(torch.int64), fresh.to(torch.int64)])
        self.in_flight.append(request)
        StepCounter.count("reuse-eviction")

    @precondition(lambda self: self.in_flight)
    @rule(pick=PICKS)
    def finish(self, pick: int) -> None:
        request = self.in_flight.pop(pick % len(self.in_flight))
        result = self.cache.insert(InsertParams(key=self._key(request.tokens), value=request.slots))
        self.allocator.free(request.slots[request.matched : result.prefix_len])
        self.cache.dec_lock_ref(request.node)
        self.keys.append((None, request.tokens))
        StepCounter.count("reuse-eviction")

    @rule(tail=TOKENS, pick=PICKS, extend=st.booleans())
    def wait(self, tail: list[int], pick: int, extend: bool) -> None:
        """A queued request: matched (re-matched through its handle later) and touched, as
        --prefill-ext-protect-waiting does every pass."""
        request = self._new_request(tail, pick, extend)
        if not request.tokens:
            return
        self.waiting = [*self.waiting, request][-4:]
        for queued in reversed(self.waiting):
            match = self.cache.match_prefix(MatchPrefixParams(key=self._key(queued.tokens), req=queued))
            self.cache.tree.touch(match.last_device_node)
        StepCounter.count("reuse-eviction")

    @rule(num_tokens=st.integers(0, 96))
    def evict(self, num_tokens: int) -> None:
        self._evict(num_tokens)
        StepCounter.count("reuse-eviction")

    @invariant()
    def every_slot_has_one_owner(self) -> None:
        if not hasattr(self, "cache"):
            return
        held = sum(len(r.slots) - r.matched for r in self.in_flight)
        assert self.allocator.available_size() + self.cache.total_size() + held == POOL_TOKENS
        tree = self.cache.tree
        nodes = list(tree.nodes())
        assert self.cache.evictable_size() == sum(n.size for n in nodes if n.lock_ref == 0)
        assert self.cache.protected_size() == sum(n.size for n in nodes if n.lock_ref > 0)
        assert all(r.node is tree.root or r.node.alive for r in self.in_flight)


ReuseEvictionMachine.TestCase.settings = machine_settings(ci_examples=300)
TestReuseEviction = ReuseEvictionMachine.TestCase


def serve_round_robin(policy: str, conversations: int, rounds: int) -> tuple[PrefixTree, list[list[int]]]:
    """Each round, every conversation in turn sends its context plus 4 new tokens, which stay cached."""
    tree = PrefixTree(eviction=policy)
    contexts = [[1000 * c + 1] * 4 for c in range(conversations)]
    for _ in range(rounds):
        for c, context in enumerate(contexts):
            context += [1000 * c + len(context)] * 4
            tree.insert(tree.query(np.array(context, dtype=np.int64)), np.zeros(len(context), dtype=np.int64))
    return tree, contexts


def test_reuse_evicts_the_tail_of_the_conversation_served_last() -> None:
    """In a loop the one served last is needed last; LRU takes the one served first (needed next),
    and a whole leaf of it."""
    tree, contexts = serve_round_robin("reuse", conversations=4, rounds=3)
    assert tree.eviction.stats.regular()
    (evicted,) = tree.evict(2)
    assert (evicted.size, evicted.end) == (2, len(contexts[3]))
    assert evicted.tokens == np.array(contexts[3][-2:], dtype=np.int64).tobytes()
    lru, _ = serve_round_robin("lru", conversations=4, rounds=3)
    (evicted,) = lru.evict(2)
    assert evicted.size == 4 and evicted.tokens.startswith(
        np.array(contexts[0][-4:], dtype=np.int64).tobytes()
    )


def test_reuse_intervals_that_do_not_repeat_turn_predictions_off() -> None:
    stats = ReuseStats()
    assert stats.regular()
    stats.observe(previous=8, interval=8)
    assert stats.regular()
    stats.observe(previous=8, interval=20)
    assert not stats.regular()
    for _ in range(ReuseStats.WINDOW):
        stats.observe(previous=8, interval=9)
    assert stats.regular()
