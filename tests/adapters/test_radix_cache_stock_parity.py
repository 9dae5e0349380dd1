"""The installed version's PrefillExtRadixCache against that version's own stock RadixCache.

Version-free: keys, matched slots and cache construction come from the version's `testing`
module, so the same test checks 0.5.17 (`device_indices`) and 0.5.23 (`device_prefix_len`,
`cache_salt`, `inserted_len`).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_prefill_ext import adapters

PAGE_SIZES = [1, 4]
POOL_SIZE = 1024

# (extra_key, cache_salt) namespaces; salted ones are dropped where the version has no salt.
NAMESPACES = [(None, None), ("lora-a", None), (None, "salt-1"), ("lora-a", "salt-1"), (None, "salt-2")]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "match", "evict"]),
        st.integers(0, len(NAMESPACES) - 1),
        st.lists(st.integers(0, 3), min_size=0, max_size=24),
        st.integers(0, 2),  # priority
    ),
    min_size=1,
    max_size=30,
)


def caches(harness: ModuleType, page_size: int, policy: str = "lru") -> tuple:
    ours = adapters.current("radix_cache").PrefillExtRadixCache
    return (
        harness.STOCK_RADIX_CACHE(harness.cpu_cache_params(policy, page_size, POOL_SIZE)),
        ours(harness.cpu_cache_params(policy, page_size, POOL_SIZE)),
    )


def namespaces(harness: ModuleType) -> list[tuple[str | None, str | None]]:
    return [ns for ns in NAMESPACES if harness.SUPPORTS_CACHE_SALT or ns[1] is None]


def match(harness: ModuleType, cache, key) -> tuple[torch.Tensor, object]:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    result = cache.match_prefix(MatchPrefixParams(key=key))
    return harness.matched_indices(cache, result), result.last_device_node


def insert(harness: ModuleType, cache, key, priority: int) -> int | None:
    """Like a finished request: reuse the cached prefix, allocate the rest, insert, free duplicates."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    aligned = len(key) // cache.page_size * cache.page_size
    reused, _ = match(harness, cache, key)
    fresh = cache.token_to_kv_pool_allocator.alloc(aligned - len(reused))
    if fresh is None:
        return None
    value = torch.cat([reused, fresh])
    result = cache.insert(InsertParams(key=key, value=value, priority=priority))
    cache.token_to_kv_pool_allocator.free_segment(
        value[len(reused) : result.prefix_len], start_pos=len(reused)
    )
    return result.prefix_len


def step(harness: ModuleType, cache, op: str, key, priority: int) -> object:
    """One operation on one cache; what it returns must be the same for stock and ours."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    if op == "insert":
        outcome: object = insert(harness, cache, key, priority)
    elif op == "match":
        outcome = match(harness, cache, key)[0].tolist()
    else:
        outcome = cache.evict(EvictParams(num_tokens=len(key))).num_tokens_evicted
    sizes = (cache.evictable_size(), cache.protected_size(), cache.total_size())
    return outcome, sizes, cache.token_to_kv_pool_allocator.available_size()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_same_results_as_stock(sglang_harness: ModuleType, page_size: int, ops: list) -> None:
    stock, ours = caches(sglang_harness, page_size)
    spaces = namespaces(sglang_harness)
    for op, ns, tokens, priority in ops:
        extra_key, salt = spaces[ns % len(spaces)]
        want, got = (
            step(sglang_harness, cache, op, sglang_harness.radix_key(tokens, extra_key, salt), priority)
            for cache in (stock, ours)
        )
        assert got == want, (op, tokens, extra_key, salt)


def test_namespaces_never_share_a_prefix(sglang_harness: ModuleType) -> None:
    """The same tokens under each (extra_key, cache_salt) are cached apart, as stock keeps them."""
    tokens = list(range(1, 9))
    for cache in caches(sglang_harness, page_size=1):
        spaces = namespaces(sglang_harness)
        for extra_key, salt in spaces:
            assert insert(sglang_harness, cache, sglang_harness.radix_key(tokens, extra_key, salt), 0) == 0
        assert cache.total_size() == len(tokens) * len(spaces)
        for extra_key, salt in spaces:
            indices, _ = match(
                sglang_harness, cache, sglang_harness.radix_key(tokens + [99], extra_key, salt)
            )
            assert len(indices) == len(tokens)


def test_locked_prefix_survives_eviction(sglang_harness: ModuleType) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    for cache in caches(sglang_harness, page_size=1):
        insert(sglang_harness, cache, sglang_harness.radix_key([1, 2, 3, 4]), 0)
        insert(sglang_harness, cache, sglang_harness.radix_key([7, 8, 9]), 0)
        _, node = match(sglang_harness, cache, sglang_harness.radix_key([1, 2, 3, 4]))
        assert cache.inc_lock_ref(node).delta == -4
        assert cache.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 3
        assert (cache.evictable_size(), cache.protected_size()) == (0, 4)
        indices, _ = match(sglang_harness, cache, sglang_harness.radix_key([1, 2, 3, 4]))
        assert len(indices) == 4
        assert cache.dec_lock_ref(node).delta == 4
