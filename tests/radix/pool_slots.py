"""The KV pool's accounting over SGLang's real token allocators, for the state machines that hold KV:
each slot has one owner (free, the tree and its chunk store, or an in-flight request's fresh slots),
and the cache's sizes are what its nodes and chunks hold."""

from __future__ import annotations

import torch
from hypothesis.stateful import invariant


def free_slots(allocator, page_size: int) -> torch.Tensor:
    """Every slot the allocator holds free (its free and release pages, as token slots)."""
    lists = (allocator.free_pages, allocator.release_pages)  # 0.5.23: release_pages None at first
    pages = torch.cat([p for p in lists if p is not None])
    if page_size == 1:
        return pages
    return (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)


class PoolAccounting:
    """Invariants for a RuleBasedStateMachine with `cache` (a PrefillExtRadixCache, once initialized),
    `allocator`, `page_size`, `in_flight` (requests with their `fresh` slots) and `pool_tokens`."""

    pool_tokens: int

    @invariant()
    def every_slot_has_one_owner(self) -> None:
        if not hasattr(self, "cache"):
            return
        free = free_slots(self.allocator, self.page_size)
        owned = [free, self.cache.all_values_flatten()] + [r.fresh for r in self.in_flight]
        slots = torch.sort(torch.cat(owned).to(torch.int64)).values
        first = self.page_size  # slot 0's page is the allocator's padding
        assert torch.equal(slots, torch.arange(first, first + self.pool_tokens)), (
            "a slot leaked or is owned twice"
        )

    @invariant()
    def sizes_are_what_is_held(self) -> None:
        if not hasattr(self, "cache"):
            return
        held = list(self.cache.tree.nodes()) + list(self.cache.tree.chunks.entries())
        assert self.cache.evictable_size() == sum(n.size for n in held if n.lock_ref == 0)
        assert self.cache.protected_size() == sum(n.size for n in held if n.lock_ref > 0)
        assert self.cache.total_size() == sum(n.size for n in held)
        fresh = sum(len(r.fresh) for r in self.in_flight)
        assert self.allocator.available_size() + self.cache.total_size() + fresh == self.pool_tokens
