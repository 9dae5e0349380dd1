"""What every version's `PrefillExtRadixCache` does the same way over the version-free `PrefixTree`.

Only names that SGLang 0.5.17 and 0.5.23 both define (same fields, same meaning) are imported from
SGLang here; everything that differs (RadixKey, MatchResult, insert, how a request is cached, KV
events) stays in each version's `radix_cache.py`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams

from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.radix.tree import PrefixTree


class TorchValues:
    """Slot arrays as int64 torch tensors on the KV pool's device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def empty(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64, device=self.device)

    def join(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat(list(parts))

    def own(self, part: torch.Tensor) -> torch.Tensor:
        return part.clone()


def unsupported_modes(params: CacheInitParams) -> list[str]:
    """The modes in `params` no version's prefix-tree cache serves, by name (empty when all is well)."""
    modes = []
    if params.is_eagle:
        modes.append("EAGLE speculative decoding (bigram radix keys, is_eagle=True)")
    if params.tree_components and any(c.name != "FULL" for c in params.tree_components):
        modes.append(f"multi-component tree ({', '.join(c.name for c in params.tree_components)})")
    if isinstance(params.token_to_kv_pool_allocator, SWATokenToKVPoolAllocator):
        modes.append("hybrid SWA KV pool (sliding-window attention)")
    if params.enable_mamba_extra_buffer or params.enable_mamba_extra_buffer_lazy:
        modes.append("hybrid SSM/Mamba state caching")
    if params.enable_session_radix_cache:
        modes.append("session radix cache")
    return modes


def pool_device(allocator: Any) -> torch.device:
    """The device of a KV allocator's slots (the CPU for a simulated cache without one)."""
    device = getattr(allocator, "device", None)
    return torch.device(device) if isinstance(device, (str, torch.device)) else torch.device("cpu")


class PrefixTreeCacheMixin:
    """Sizes, locks, eviction and debugging views of a cache whose state is `self.tree`.

    Mixed in before SGLang's `BasePrefixCache`; the class sets `tree`, `disable` and
    `token_to_kv_pool_allocator`, and may override `_on_evicted` (e.g. to record KV events).
    """

    tree: PrefixTree
    disable: bool
    token_to_kv_pool_allocator: Any

    # ----- sizes (the scheduler reads these every step) -----

    @property
    def root_node(self) -> Node:
        return self.tree.root

    @property
    def evictable_size_(self) -> int:
        return self.tree.evictable_tokens

    @property
    def protected_size_(self) -> int:
        return self.tree.protected_tokens

    @protected_size_.setter
    def protected_size_(self, value: int) -> None:
        # SGLang's decode KV-offload manager adjusts this counter directly.
        self.tree.protected_tokens = value

    def evictable_size(self) -> int:
        return self.tree.evictable_tokens

    def protected_size(self) -> int:
        return self.tree.protected_tokens

    def total_size(self) -> int:
        return self.tree.cached_tokens

    def stats(self) -> dict[str, int]:
        """Cumulative hit/miss/evicted/inserted tokens and live nodes, for metrics."""
        return self.tree.counters.as_dict()

    # ----- locks and eviction -----

    def inc_lock_ref(self, node: Node) -> IncLockRefResult:
        if self.disable:
            return IncLockRefResult(delta=0)
        return IncLockRefResult(delta=self.tree.lock(node))

    def dec_lock_ref(self, node: Node, params: DecLockRefParams | None = None) -> DecLockRefResult:
        if self.disable:
            return DecLockRefResult(delta=0)
        return DecLockRefResult(delta=self.tree.unlock(node))

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable:
            return EvictResult()
        start_time = time.perf_counter()
        evicted = self.tree.evict(params.num_tokens)
        for node in evicted:
            # Tree values are page-aligned copies of a kv row: page-exact segment.
            self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
            self._on_evicted(node)
        num_evicted = sum(node.size for node in evicted)
        self.update_eviction_metrics(num_evicted, start_time)  # type: ignore[attr-defined]
        return EvictResult(num_tokens_evicted=num_evicted)

    def _on_evicted(self, node: Node) -> None:
        """Called once per evicted node, after its slots went back to the allocator."""

    # ----- views -----

    def path_device_indices(self, node: Node) -> torch.Tensor:
        """KV slots on the path from the root to `node`."""
        values = [n.value for n in node.path()]
        return self.tree.values.join(values) if values else self.tree.values.empty()

    def all_values_flatten(self) -> torch.Tensor:
        values = [node.value for node in self.tree.nodes()]
        return torch.cat(values) if values else self.tree.values.empty()

    def pretty_print(self) -> None:
        stack = [(self.tree.root, 0)]
        while stack:
            node, indent = stack.pop()
            tokens = as_token_array(node.tokens, min(node.size, 10)).tolist()
            print(" " * indent, node.size, tokens, f"r={node.lock_ref}")
            stack.extend((child, indent + 2) for child in node.children.values())
        print(f"#tokens: {self.total_size()}")
