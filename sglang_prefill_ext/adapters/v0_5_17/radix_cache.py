"""SGLang 0.5.17 drop-in for `RadixCache`, backed by the version-free `PrefixTree`.

Same parameter and result types as stock (MatchPrefixParams, MatchResult, InsertParams, ...), same
KV slot accounting with the allocator, same KV events. What differs is inside: a waiting request's
repeated `match_prefix` extends its previous match (a `MatchHandle` kept per request) instead of
walking the whole prompt again, and lookups compare stored token bytes with memcmp.

Set-up, match, insert, sizes, locks, eviction and debug views are shared with 0.5.23
(`adapters.tree_backed`); here are 0.5.17's keys and results, its request caching and its KV events.
"""

from __future__ import annotations

import weakref
from array import array
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, StorageMedium
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, InsertParams, MatchResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64

from sglang_prefill_ext.adapters.tree_backed import PrefixTreeCacheMixin
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.radix.tree import Reinsert

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


class PrefillExtRadixCache(PrefixTreeCacheMixin, BasePrefixCache):
    def __init__(self, params: CacheInitParams, config: PrefillExtConfig | None = None) -> None:
        self.enable_kv_cache_events = params.enable_kv_cache_events
        self.kv_event_queue: list[Any] = []
        self.disable_finished_insert = params.disable_finished_insert
        self._setup(params, config, self._split_event_hashes if self.enable_kv_cache_events else None)
        # Requests whose complete prompt is cached already (a decoding request after its prefill).
        self._checkpointed: weakref.WeakSet[Req] = weakref.WeakSet()
        # Blended requests (`blending.Blending`): the tree takes only their first tokens, whose KV is exact.
        self.exact_lens: weakref.WeakKeyDictionary[Req, int] = weakref.WeakKeyDictionary()
        self.reset()

    # ----- 0.5.17's keys and results -----

    def _namespace(self, key: RadixKey) -> Hashable:
        return key.extra_key

    def _req_query(self, req: Req, token_ids: Any) -> Query:
        length = min(len(token_ids), self.exact_lens.get(req, len(token_ids)))
        return self.tree.query(as_token_array(token_ids, length), req.extra_key)

    def _match_result(self, handle: MatchHandle | None) -> MatchResult:
        node = self.tree.root if handle is None else handle.node
        return MatchResult(
            device_indices=self.tree.values.empty() if handle is None else handle.values,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
        )

    def _is_reinsert(self, params: InsertParams) -> bool:
        return params.chunked

    # ----- requests -----

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
        query = self._req_query(req, token_ids)
        key_len = query.length
        reinsert = Reinsert.COUNTED if req in self._checkpointed else Reinsert.NO
        self._checkpointed.discard(req)
        if is_insert:
            values = kv_indices[:key_len].to(dtype=torch.int64, copy=True)
            priority = getattr(req, "priority", 0) or 0
            freed_end = self._insert(query, values, priority, reinsert).prefix_len
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
        query = self._req_query(req, token_ids)
        values = kv_indices[: query.length].to(dtype=torch.int64, copy=True)
        # A prompt's last chunk or a decoding request: its first complete insert is its use of the
        # tree; later ones (another checkpoint, its finish) insert it again.
        if chunked:
            reinsert = Reinsert.UNCOUNTED
        else:
            reinsert = Reinsert.COUNTED if req in self._checkpointed else Reinsert.NO
            self._checkpointed.add(req)
        priority = getattr(req, "priority", 0) or 0
        new_prefix_len = self._insert(query, values, priority, reinsert).prefix_len
        self.token_to_kv_pool_allocator.free_segment(
            kv_indices[req.cache_protected_len : new_prefix_len], start_pos=req.cache_protected_len
        )

        handle = self._repoint_row(req, query, req.req_pool_idx, req.cache_protected_len)
        new_indices, new_last_node = handle.values, handle.node
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

    def _on_stored(self, node: Node) -> None:
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

    def _on_evicted(self, node: Node) -> None:
        if self.enable_kv_cache_events and node.size:
            hashes = [hash_str_to_int64(h) for h in self._page_hashes(node)]
            self.kv_event_queue.append(BlockRemoved(block_hashes=hashes, medium=StorageMedium.GPU))

    def _on_cleared(self) -> None:
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())

    def take_events(self) -> list[Any]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
