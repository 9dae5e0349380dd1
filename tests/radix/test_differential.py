"""The same random operations on the installed SGLang's stock RadixCache and on PrefillExtRadixCache.

Both sit on real CPU KV allocators; every step must agree on matched slots, insert prefix lengths,
lock deltas, sizes, KV events, and the exact slots (in order) handed back to the allocator. Keys,
matched slots, namespaces and KV-event settings come from the version's `testing` harness
(`harness.current("testing")`; SGLang is patched at session start, before this module imports).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

from sglang_prefill_ext import adapters, harness  # noqa: E402
from tests.radix.profiles import StepCounter, machine_settings  # noqa: E402
from tests.radix.strategies import PICKS, TOKENS, grow_key  # noqa: E402

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache

POOL_TOKENS = 4096
STOCK_POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]
# (extra_key, cache_salt); the salted ones only where the version's keys have a salt.
NAMESPACES = st.sampled_from(
    [(None, None), ("lora-a", None)]
    + ([(None, "salt-1"), ("lora-a", "salt-1")] if HARNESS.SUPPORTS_CACHE_SALT else [])
)


def make_allocator(page_size: int) -> TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator:
    if page_size == 1:
        return TokenToKVPoolAllocator(POOL_TOKENS, torch.int64, "cpu", None, need_sort=False)
    return PagedTokenToKVPoolAllocator(POOL_TOKENS, page_size, torch.int64, "cpu", None, need_sort=False)


class WaitingRequest:
    """Stands for a queued request: only its identity matters (the adapter keys match handles on it)."""


class DifferentialMachine(RuleBasedStateMachine):
    @initialize(
        page_size=st.sampled_from([1, 4]),
        policy=st.sampled_from(STOCK_POLICIES),
        events=st.sampled_from(HARNESS.kv_event_options()),
    )
    def setup(self, page_size: int, policy: str, events: dict[str, Any]) -> None:
        def params() -> CacheInitParams:
            return CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=make_allocator(page_size),
                page_size=page_size,
                eviction_policy=policy,
                **events,
            )

        self.caches = (HARNESS.STOCK_RADIX_CACHE(params()), PrefillExtRadixCache(params()))
        self.page_size = page_size
        self.keys: list[tuple[tuple[str | None, str | None], list[int]]] = []
        self.requests = [WaitingRequest() for _ in range(3)]
        self.last_nodes: tuple | None = None
        self.locks: list[tuple] = []

    def _key(self, namespace: tuple[str | None, str | None], tokens: list[int]) -> Any:
        return HARNESS.radix_key(tokens, *namespace)

    def _match_both(
        self, namespace: tuple[str | None, str | None], tokens: list[int], request: object | None = None
    ) -> torch.Tensor:
        results = [
            cache.match_prefix(MatchPrefixParams(key=self._key(namespace, tokens), req=request))
            for cache in self.caches
        ]
        stock, ours = (
            HARNESS.matched_indices(cache, result) for cache, result in zip(self.caches, results, strict=True)
        )
        assert torch.equal(stock, ours), (stock, ours)
        self.last_nodes = tuple(result.last_device_node for result in results)
        return stock

    @rule(
        namespace=NAMESPACES,
        tail=TOKENS,
        pick=PICKS,
        extend=st.booleans(),
        priority=st.integers(0, 3),
        reuse_prefix=st.booleans(),
    )
    def insert(
        self,
        namespace: tuple[str | None, str | None],
        tail: list[int],
        pick: int,
        extend: bool,
        priority: int,
        reuse_prefix: bool,
    ) -> None:
        """Like a finished request: reuse the matched prefix (or not), allocate the rest, insert, free dups."""
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        aligned = len(tokens) // self.page_size * self.page_size
        matched = len(self._match_both(namespace, tokens)) if reuse_prefix else 0
        prefix_lens, new_slots = [], []
        for cache in self.caches:
            allocator = cache.token_to_kv_pool_allocator
            fresh = allocator.alloc(aligned - matched)
            if fresh is None:
                return
            match = cache.match_prefix(MatchPrefixParams(key=self._key(namespace, tokens)))
            reused = HARNESS.matched_indices(cache, match)
            value = torch.cat([reused[:matched], fresh])
            result = cache.insert(
                InsertParams(key=self._key(namespace, tokens), value=value, priority=priority)
            )
            allocator.free_segment(value[matched : result.prefix_len], start_pos=matched)
            prefix_lens.append(result.prefix_len)
            new_slots.append(fresh)
        assert prefix_lens[0] == prefix_lens[1]
        assert torch.equal(*new_slots)
        self.keys.append((namespace, tokens))
        StepCounter.count("differential")

    @rule(
        namespace=NAMESPACES,
        tail=TOKENS,
        pick=PICKS,
        extend=st.booleans(),
        request=st.sampled_from([None, 0, 1, 2]),
    )
    def match(
        self,
        namespace: tuple[str | None, str | None],
        tail: list[int],
        pick: int,
        extend: bool,
        request: int | None,
    ) -> None:
        namespace, tokens = grow_key(self.keys, pick, extend, namespace, tail)
        self._match_both(namespace, tokens, None if request is None else self.requests[request])
        StepCounter.count("differential")

    @precondition(lambda self: self.last_nodes is not None)
    @rule()
    def lock(self) -> None:
        if not self.last_nodes[1].alive:
            return  # evicted since that match
        deltas = [
            cache.inc_lock_ref(node).delta for cache, node in zip(self.caches, self.last_nodes, strict=True)
        ]
        assert deltas[0] == deltas[1]
        self.locks.append(self.last_nodes)
        StepCounter.count("differential")

    @precondition(lambda self: self.locks)
    @rule(pick=PICKS)
    def unlock(self, pick: int) -> None:
        nodes = self.locks.pop(pick % len(self.locks))
        deltas = [cache.dec_lock_ref(node).delta for cache, node in zip(self.caches, nodes, strict=True)]
        assert deltas[0] == deltas[1]
        StepCounter.count("differential")

    @rule(num_tokens=st.integers(0, 96))
    def evict(self, num_tokens: int) -> None:
        results = [cache.evict(EvictParams(num_tokens=num_tokens)) for cache in self.caches]
        assert results[0].num_tokens_evicted == results[1].num_tokens_evicted
        stock_free, our_free = (cache.token_to_kv_pool_allocator.free_pages for cache in self.caches)
        assert torch.equal(stock_free, our_free), "different KV slots handed back"
        StepCounter.count("differential")

    @precondition(lambda self: not self.locks)
    @rule()
    def reset(self) -> None:
        for cache in self.caches:
            cache.reset()
            cache.token_to_kv_pool_allocator.clear()
        self.last_nodes = None
        StepCounter.count("differential")

    @invariant()
    def sizes_agree(self) -> None:
        stock, ours = self.caches
        assert stock.evictable_size() == ours.evictable_size()
        assert stock.protected_size() == ours.protected_size()
        assert stock.total_size() == ours.total_size() == ours.evictable_size() + ours.protected_size()
        assert (
            stock.token_to_kv_pool_allocator.available_size()
            == ours.token_to_kv_pool_allocator.available_size()
        )

    @invariant()
    def events_agree(self) -> None:
        stock, ours = self.caches
        assert stock.take_events() == ours.take_events()


DifferentialMachine.TestCase.settings = machine_settings(ci_examples=850)
TestDifferential = DifferentialMachine.TestCase
