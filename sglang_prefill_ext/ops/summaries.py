"""Pooled key summaries kept next to the KV cache, so a cached prefix is never rescored.

One summary per (scoring layer, full key block): the mean key of the block's `block_size` tokens,
keyed by the KV-cache slot of the block's first token. Blocks are aligned to absolute positions, and
a cached prefix shares its slots and positions with every request that reuses it, so the first
token's slot names the block wherever it is reused. Slots for summaries come from a device-side free
stack (no host sync); a summary lives until `release` is called for its first token's KV slot, which
the serving side does whenever it frees KV slots or overwrites them. When the stack runs dry, new
blocks simply get no summary and are pooled from their keys again: never wrong, only slower.
"""

from __future__ import annotations

import torch


class KeySummaryCache:
    """Per-block pooled keys for `num_layers` scoring layers over a KV pool of `pool_size` slots."""

    def __init__(
        self,
        pool_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        device: torch.device | str,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.capacity = pool_size // block_size + 1
        self.slot_of_loc = torch.full((pool_size,), -1, dtype=torch.int32, device=device)
        # one spare row at the end takes the writes of blocks that found no free slot
        self.summaries = torch.zeros(
            num_layers, self.capacity + 1, num_kv_heads, head_dim, dtype=dtype, device=device
        )
        self._free = torch.arange(self.capacity, dtype=torch.int32, device=device)
        self._top = torch.full((1,), self.capacity, dtype=torch.int64, device=device)

    @property
    def num_free(self) -> torch.Tensor:
        return self._top.clone()

    def lookup(self, head_locs: torch.Tensor) -> torch.Tensor:
        """Summary slot of each block (by its first token's KV slot), -1 where there is none."""
        return self.slot_of_loc[head_locs.long()]

    def allocate(self, head_locs: torch.Tensor) -> torch.Tensor:
        """Give each block a fresh slot (releasing any it had); -1 for blocks left without one."""
        self.release(head_locs)
        n = head_locs.numel()
        want = self._top - 1 - torch.arange(n, device=self._top.device)
        slots = torch.where(want >= 0, self._free[want.clamp(min=0)], -1).to(torch.int32)
        self._top.sub_(n).clamp_(min=0)
        self.slot_of_loc[head_locs.long()] = slots
        return slots

    def write(self, layer: int, slots: torch.Tensor, pooled: torch.Tensor) -> None:
        """Store pooled keys [n, Hkv, D] of the blocks `allocate` gave `slots`."""
        rows = torch.where(slots >= 0, slots, self.capacity).long()
        self.summaries[layer].index_copy_(0, rows, pooled.to(self.summaries.dtype))

    def read(self, layer: int) -> torch.Tensor:
        """The summaries of one scoring layer, [capacity + 1, Hkv, D], indexed by slot."""
        return self.summaries[layer]

    def release(self, locs: torch.Tensor) -> None:
        """Forget the summaries of blocks whose first token's KV slot is in `locs` (freed or rewritten)."""
        locs = locs.long()
        slots = self.slot_of_loc[locs]
        held = slots >= 0
        # one loc may appear twice in `locs`; count each slot once
        first = torch.ones_like(held)
        if locs.numel() > 1:
            order = torch.argsort(locs, stable=True)
            sorted_locs = locs[order]
            dup = torch.zeros_like(held)
            dup[order[1:]] = sorted_locs[1:] == sorted_locs[:-1]
            first = ~dup
        held &= first
        dest = torch.where(held, self._top + torch.cumsum(held, 0) - 1, self.capacity)
        spill = torch.empty(self.capacity + 1, dtype=torch.int32, device=slots.device)
        spill[: self.capacity] = self._free
        spill.index_copy_(0, dest.long(), torch.where(held, slots, -1).to(torch.int32))
        self._free.copy_(spill[: self.capacity])
        self._top.add_(held.sum())
        self.slot_of_loc[locs] = -1
