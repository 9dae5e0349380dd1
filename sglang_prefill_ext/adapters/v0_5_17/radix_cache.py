"""SGLang 0.5.17 drop-in for `RadixCache`, backed by the version-free `PrefixTree`.

Same parameter and result types as stock (MatchPrefixParams, MatchResult, InsertParams, ...), same
KV slot accounting with the allocator, same KV events. What differs is inside: a waiting request's
repeated `match_prefix` extends its previous match (a `MatchHandle` kept per request) instead of
walking the whole prompt again, and lookups jump deep with grid hashes and compare with memcmp.
"""

from __future__ import annotations

import time
import weakref
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, StorageMedium
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64

from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.radix.tree import InsertOutcome, PrefixTree

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


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
    """The modes in `params` this cache cannot serve, by name (empty when all is well)."""
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


class PrefillExtRadixCache(BasePrefixCache):
    def __init__(self, params: CacheInitParams, config: PrefillExtConfig | None = None) -> None:
        refused = unsupported_modes(params)
        if refused:
            raise ValueError(f"sglang-prefill-ext prefix tree does not support: {'; '.join(refused)}")
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.enable_kv_cache_events = params.enable_kv_cache_events
        self.is_eagle = False
        self.disable_finished_insert = params.disable_finished_insert
        self.eviction_policy = ((config and config.eviction) or params.eviction_policy).lower()
        self.kv_event_queue: list[Any] = []
        if params.enable_metrics:
            self.init_metrics_collector()
        self.device = self._pool_device()
        self.tree = PrefixTree(
            page_size=self.page_size,
            eviction=self.eviction_policy,
            values=TorchValues(self.device),
            on_split=self._split_event_hashes if self.enable_kv_cache_events else None,
        )
        self._handles: weakref.WeakKeyDictionary[Req, MatchHandle] = weakref.WeakKeyDictionary()
        self.reset()

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: Any | None = None,
        page_size: int = 1,
        enable_kv_cache_events: bool = False,
    ) -> PrefillExtRadixCache:
        """A cache without memory pools, for simulation and tests (same keywords as stock)."""
        params = CacheInitParams(
            disable=disable,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=mock_allocator,
            page_size=page_size,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        return cls(params)

    def _pool_device(self) -> torch.device:
        device = getattr(self.token_to_kv_pool_allocator, "device", None)
        return torch.device(device) if isinstance(device, (str, torch.device)) else torch.device("cpu")

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
        # The 0.5.17 decode KV-offload manager adjusts this counter directly.
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

    # ----- public API -----

    def reset(self) -> None:
        self.tree.reset()
        self._handles.clear()
        self._record_all_cleared_event()

    def _query(self, key: RadixKey) -> Query:
        if key.is_bigram:
            raise ValueError("sglang-prefill-ext prefix tree does not support bigram (EAGLE) radix keys")
        return self._query_tokens(key.token_ids, key.extra_key, len(key))

    def _query_tokens(self, token_ids: Any, extra_key: str | None, length: int | None = None) -> Query:
        length = len(token_ids) if length is None else length
        return self.tree.query(as_token_array(token_ids, length), extra_key)

    def _empty_match(self) -> MatchResult:
        root = self.tree.root
        return MatchResult(
            device_indices=self.tree.values.empty(),
            last_device_node=root,
            last_host_node=root,
            best_match_node=root,
        )

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached prefix of `params.key`; with `params.req`, extends that request's last match."""
        if self.disable or len(params.key) == 0:
            return self._empty_match()
        query = self._query(params.key)
        if query.length == 0:
            return self._empty_match()
        req = params.req
        handle = self.tree.match(query, self._handles.get(req) if req is not None else None)
        if req is not None:
            self._handles[req] = handle
        return MatchResult(
            device_indices=handle.values,
            last_device_node=handle.node,
            last_host_node=handle.node,
            best_match_node=handle.node,
        )

    def insert(self, params: InsertParams) -> InsertResult:
        if self.disable:
            return InsertResult(prefix_len=0)
        query = self._query(params.key)
        if params.value is not None:
            value = params.value[: query.length]
        else:
            # Debug/test fallback, as stock: the token ids stand in for slots.
            value = torch.tensor(query.tokens, dtype=torch.int64)
        outcome = self._insert(query, value, params.priority or 0, params.chunked)
        return InsertResult(prefix_len=outcome.prefix_len, last_device_node=outcome.last_node)

    def _insert(self, query: Query, value: torch.Tensor, priority: int, chunked: bool) -> InsertOutcome:
        outcome = self.tree.insert(query, value, priority, chunked)
        if outcome.new_leaf is not None:
            self._record_store_event(outcome.new_leaf)
        return outcome

    def cache_finished_req(self, req: Req, is_insert: bool = True, *, kv_len_to_handle: int) -> None:
        """Cache a finished request's KV; free what the tree already had and the unaligned tail."""
        self._handles.pop(req, None)
        if self.disable_finished_insert:
            is_insert = False
        if self.disable:
            # The protected prefix is not this req's to free.
            kv_indices = self.req_to_token_pool.req_to_token[
                req.req_pool_idx, req.cache_protected_len : kv_len_to_handle
            ]
            self.token_to_kv_pool_allocator.free_segment(kv_indices, start_pos=req.cache_protected_len)
            return

        token_ids = (req.origin_input_ids + req.output_ids)[:kv_len_to_handle]
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(token_ids)]
        query = self._query_tokens(token_ids, req.extra_key)
        key_len = query.length
        if is_insert:
            values = kv_indices[:key_len].to(dtype=torch.int64, copy=True)
            freed_end = self._insert(query, values, getattr(req, "priority", 0) or 0, False).prefix_len
        else:
            freed_end = key_len
        self.token_to_kv_pool_allocator.free_segments(
            [
                (kv_indices[req.cache_protected_len : freed_end], req.cache_protected_len),
                (kv_indices[key_len:], key_len),
            ]
        )
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req: Req, chunked: bool = False) -> None:
        """Cache a running request's KV so far and move its lock and prefix onto the tree's copy."""
        if self.disable:
            return
        token_ids = req.get_fill_ids()
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(token_ids)]
        query = self._query_tokens(token_ids, req.extra_key)
        values = kv_indices[: query.length].to(dtype=torch.int64, copy=True)
        new_prefix_len = self._insert(query, values, getattr(req, "priority", 0) or 0, chunked).prefix_len
        self.token_to_kv_pool_allocator.free_segment(
            kv_indices[req.cache_protected_len : new_prefix_len], start_pos=req.cache_protected_len
        )

        handle = self.tree.match(query, self._handles.get(req))
        self._handles[req] = handle
        new_indices, new_last_node = handle.values, handle.node
        assert len(new_indices) == query.length, f"{len(new_indices)=}, {query.length=}"
        self.req_to_token_pool.write(
            (req.req_pool_idx, slice(req.cache_protected_len, len(new_indices))),
            new_indices[req.cache_protected_len :],
        )
        # Page size > 1: the unaligned tail stays in prefix_indices but not in the tree; it is freed
        # by the next cache_*_req, from cache_protected_len on.
        req.cache_protected_len = len(new_indices)
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last_node)
        if len(new_indices) < len(kv_indices):
            req.prefix_indices = torch.cat([new_indices, kv_indices[len(new_indices) :]])
        else:
            req.prefix_indices = new_indices
        req.last_node = new_last_node

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable:
            return EvictResult()
        start_time = time.perf_counter()
        evicted = self.tree.evict(params.num_tokens)
        for node in evicted:
            # Tree values are page-aligned copies of a kv row: page-exact segment.
            self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
            self._record_remove_event(node)
        num_evicted = sum(node.size for node in evicted)
        self.update_eviction_metrics(num_evicted, start_time)
        return EvictResult(num_tokens_evicted=num_evicted)

    def inc_lock_ref(self, node: Node) -> IncLockRefResult:
        if self.disable:
            return IncLockRefResult(delta=0)
        return IncLockRefResult(delta=self.tree.lock(node))

    def dec_lock_ref(self, node: Node, params: DecLockRefParams | None = None) -> DecLockRefResult:
        if self.disable:
            return DecLockRefResult(delta=0)
        return DecLockRefResult(delta=self.tree.unlock(node))

    def pretty_print(self) -> None:
        stack = [(self.tree.root, 0)]
        while stack:
            node, indent = stack.pop()
            tokens = as_token_array(node.tokens, min(node.size, 10)).tolist()
            print(" " * indent, node.size, tokens, f"r={node.lock_ref}")
            stack.extend((child, indent + 2) for child in node.children.values())
        print(f"#tokens: {self.total_size()}")

    def all_values_flatten(self) -> torch.Tensor:
        values = [node.value for node in self.tree.nodes()]
        return torch.cat(values) if values else self.tree.values.empty()

    # ----- KV events: the same payloads as stock's KVCacheEventMixin -----

    def _page_hashes(self, node: Node) -> list[str]:
        if node.meta is None:
            parent = node.parent
            prior = parent.meta[-1] if parent is not self.tree.root and parent.meta else None
            tokens = array("q")
            tokens.frombytes(node.tokens)
            node.meta = get_hash_str(tokens, prior, page_size=self.page_size)
        return node.meta

    def _split_event_hashes(self, prefix: Node, tail: Node) -> None:
        if tail.meta is not None:
            pages = prefix.size // self.page_size
            prefix.meta, tail.meta = tail.meta[:pages], tail.meta[pages:]

    def _record_store_event(self, node: Node) -> None:
        if not self.enable_kv_cache_events:
            return
        hashes = self._page_hashes(node)
        parent = node.parent
        parent_hash = (
            hash_str_to_int64(parent.meta[-1]) if parent is not self.tree.root and parent.meta else None
        )
        tokens = as_token_array(node.tokens, node.size).tolist()
        for page, start in enumerate(range(0, node.size, self.page_size)):
            page_tokens = tokens[start : start + self.page_size]
            block_hash = hash_str_to_int64(hashes[page])
            self.kv_event_queue.append(
                BlockStored(
                    block_hashes=[block_hash],
                    parent_block_hash=parent_hash,
                    token_ids=page_tokens,
                    block_size=len(page_tokens),
                    lora_id=None,
                    medium=StorageMedium.GPU,
                )
            )
            parent_hash = block_hash

    def _record_remove_event(self, node: Node) -> None:
        if self.enable_kv_cache_events and node.size:
            hashes = [hash_str_to_int64(h) for h in self._page_hashes(node)]
            self.kv_event_queue.append(BlockRemoved(block_hashes=hashes, medium=StorageMedium.GPU))

    def _record_all_cleared_event(self) -> None:
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())

    def take_events(self) -> list[Any]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
