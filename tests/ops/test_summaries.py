"""Key summaries kept next to the KV cache: slots, release, exhaustion, and use in scoring."""

from __future__ import annotations

import torch
from kvpool import make_pool

from sglang_prefill_ext.ops.layout import BlockLayout, context_locs
from sglang_prefill_ext.ops.pooling import key_segments, pool_keys
from sglang_prefill_ext.ops.settings import SparseSettings
from sglang_prefill_ext.ops.sparse_prefill import SparsePrefill
from sglang_prefill_ext.ops.summaries import KeySummaryCache


def _cache(pool_size: int = 64, block: int = 16) -> KeySummaryCache:
    return KeySummaryCache(
        pool_size, num_layers=2, num_kv_heads=2, head_dim=8, block_size=block, device="cpu"
    )


def test_allocate_write_lookup_release() -> None:
    cache = _cache()
    heads = torch.tensor([3, 17, 40])
    slots = cache.allocate(heads)
    assert bool((slots >= 0).all()) and len(set(slots.tolist())) == 3
    pooled = torch.randn(3, 2, 8)
    cache.write(1, slots, pooled)
    assert torch.equal(cache.lookup(heads), slots)
    torch.testing.assert_close(cache.read(1)[slots.long()].float(), pooled, atol=1e-2, rtol=1e-2)
    assert int(cache.num_free) == cache.capacity - 3
    cache.release(torch.tensor([17, 17, 5]))  # duplicates and slots without a summary are fine
    assert cache.lookup(heads).tolist() == [int(slots[0]), -1, int(slots[2])]
    assert int(cache.num_free) == cache.capacity - 2


def test_reallocating_a_block_frees_its_old_slot() -> None:
    cache = _cache()
    cache.allocate(torch.tensor([8]))
    cache.allocate(torch.tensor([8]))
    assert int(cache.num_free) == cache.capacity - 1


def test_exhaustion_leaves_blocks_without_summary_never_sharing_slots() -> None:
    cache = _cache(pool_size=32, block=16)  # capacity 3
    slots = cache.allocate(torch.tensor([0, 5, 9, 20, 30]))
    held = slots[slots >= 0]
    assert held.numel() == cache.capacity and len(set(held.tolist())) == cache.capacity
    assert int(cache.num_free) == 0
    cache.write(0, slots, torch.randn(5, 2, 8))  # blocks without a slot write nowhere that matters
    cache.release(torch.arange(32))
    assert int(cache.num_free) == cache.capacity and bool((cache.slot_of_loc == -1).all())
    assert sorted(cache.allocate(torch.tensor([1, 2, 3])).tolist()) == list(range(cache.capacity))


def test_chunked_prefill_never_rescored_its_cached_prefix() -> None:
    """Chunk 2 reads chunk 1's block summaries: poisoning those keys changes nothing."""
    block, first, second = 16, 64, 40
    pool = make_pool([first + second], page_size=1, num_kv_heads=2, head_dim=32, dtype=torch.float32)
    cache = KeySummaryCache(pool.k.shape[0], 1, 2, 32, block, "cpu", dtype=torch.float32)
    sparse = SparsePrefill(SparseSettings(block_size=block, scorer="pooled"), attention=None, summaries=cache)

    def select(prefix: int, extend: int, k: torch.Tensor) -> torch.Tensor:
        layout = BlockLayout.build([prefix], [extend], block)
        sparse.begin(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
        return sparse.select(torch.randn(extend, 8, 32), k, 0.2, summary_layer=0)

    select(0, first, pool.k)
    assert int(cache.num_free) == cache.capacity - first // block
    poisoned = pool.k.clone()
    prefix_locs = pool.req_to_token[pool.req_pool_indices[0], :first].long()
    poisoned[prefix_locs] = float("nan")
    layout = BlockLayout.build([first], [second], block)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    slots = torch.where(layout.key_cached, cache.lookup(locs[layout.key_tok_start]), -1)
    kpool = pool_keys(poisoned, key_segments(layout, locs, slots, cache.read(0)))
    torch.testing.assert_close(kpool, pool_keys(pool.k, key_segments(layout, locs)))
    assert bool(select(first, second, poisoned).any())
