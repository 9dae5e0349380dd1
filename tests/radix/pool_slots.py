"""Slot ownership over SGLang's real token allocators, shared by the state machines that hold KV."""

from __future__ import annotations

import torch


def free_slots(allocator, page_size: int) -> torch.Tensor:
    """Every slot the allocator holds free (its free and release pages, as token slots)."""
    lists = (allocator.free_pages, allocator.release_pages)  # 0.5.23: release_pages None at first
    pages = torch.cat([p for p in lists if p is not None])
    if page_size == 1:
        return pages
    return (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)


def assert_one_owner(owned: list[torch.Tensor], page_size: int, pool_tokens: int) -> None:
    """The owned slot lists together are the pool, each slot once (slot 0's page is the allocator's padding)."""
    slots = torch.sort(torch.cat(owned).to(torch.int64)).values
    assert torch.equal(slots, torch.arange(page_size, page_size + pool_tokens)), (
        "a slot leaked or is owned twice"
    )
