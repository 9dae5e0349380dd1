"""SGLang 0.5.23 drop-in for `RadixCache`, backed by the version-free `PrefixTree`.

Same parameter and result types as 0.5.23's stock cache, the same KV slot accounting and the same KV
events. What 0.5.23 changed against 0.5.17, and where this adapter follows it:

- `RadixKey.cache_salt` namespaces the tree like `extra_key`: the core's namespace is
  `extra_key`, or `(extra_key, cache_salt)` when a salt is set;
- `MatchResult` carries `device_prefix_len` (the slots are read with `path_device_indices`);
- `InsertParams.inserted_len` replaces `chunked`: what a request inserted before is not a reuse;
- a running or finishing request is cached by `checkpoint(req, up_to=...)` on `req.kv` (the
  scheduler's `release_kv_cache` frees the row and unlocks `req.lock`), with the prompt boundary
  split off so eviction can drop the output KV first; `on_release` forgets the request;
- KV events come from stock's own `KVCacheEventRecorder`, which reads a node's `key`, `parent` and
  cached `hash_value` / `event_hash_value`: each tree node gets an `EventNode` that shows it so.

Set-up, match, insert, sizes, locks, eviction and debug views are shared with 0.5.17
(`adapters.tree_backed`).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, InsertParams, MatchResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import split_node_hash_value

from sglang_prefill_ext.adapters.tree_backed import PrefixTreeCacheMixin
from sglang_prefill_ext.adapters.v0_5_23.keys import key_parts, namespace
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.radix.tree import Reinsert

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

_MAX_PRIORITY = torch.iinfo(torch.int64).max


class EventNode:
    """A prefix-tree node as 0.5.23's `KVCacheEventRecorder` reads a stock `TreeNode`.

    `key` is the node's tokens as a `RadixKey` in its namespace, `parent` the parent's `EventNode`
    (None above the root), and the recorder caches the page hashes in `hash_value` /
    `event_hash_value`; on a split they are cut as stock cuts them (`PrefillExtRadixCache._split_event_nodes`).
    """

    __slots__ = ("node", "key", "hash_value", "event_hash_value")

    def __init__(
        self, node: Node, hash_value: list[str] | None = None, event_hash_value: list[str] | None = None
    ) -> None:
        tokens = array("q")
        tokens.frombytes(node.tokens)
        extra_key, cache_salt = key_parts(node.namespace)
        self.node = node
        self.key = RadixKey(tokens, extra_key, cache_salt=cache_salt)
        # Stock's root has an empty hash list: its children chain from no prior hash.
        self.hash_value = [] if node.parent is None else hash_value
        self.event_hash_value = event_hash_value

    @property
    def parent(self) -> EventNode | None:
        return None if self.node.parent is None else event_node(self.node.parent)


def event_node(node: Node) -> EventNode:
    """`node`'s `EventNode`, kept in `node.meta`."""
    if node.meta is None:
        node.meta = EventNode(node)
    return node.meta


class PrefillExtRadixCache(PrefixTreeCacheMixin, BasePrefixCache):
    def __init__(self, params: CacheInitParams, config: PrefillExtConfig | None = None) -> None:
        # As stock: a disabled tree holds nothing, so it reports no KV events.
        self.kv_events = KVCacheEventRecorder(
            enabled=params.enable_kv_cache_events and not params.disable,
            page_size=params.page_size,
            dynamo_format=params.dynamo_kv_event_format,
            lora_names=params.kv_event_lora_names,
        )
        self._setup(params, config, self._split_event_nodes if self.kv_events.enabled else None)
        self.reset()

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    # ----- 0.5.23's keys and results -----

    def _namespace(self, key: RadixKey) -> Hashable:
        return namespace(key.extra_key, key.cache_salt)

    def _req_query(self, req: Req, token_ids: Any, length: int) -> Query:
        return self.tree.query(as_token_array(token_ids, length), namespace(req.extra_key, req.cache_salt))

    def _match_result(self, handle: MatchHandle | None) -> MatchResult:
        node = self.tree.root if handle is None else handle.node
        return MatchResult(
            device_prefix_len=0 if handle is None else handle.length,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
        )

    def _is_reinsert(self, params: InsertParams) -> bool:
        # 0.5.23 counts no hit on what the same request inserted before (inserted_len).
        return params.inserted_len > 0

    def touch_prefix(self, key: RadixKey) -> None:
        """Refresh recency along `key`'s cached path, as a match does, without returning anything."""
        if self.disable or len(key) == 0:
            return
        query = self._query(key)
        if query.length:
            self.tree.match(query)

    # ----- KV events, recorded by stock's recorder -----

    def _split_event_nodes(self, prefix: Node, tail: Node) -> None:
        if tail.meta is not None:
            old = tail.meta
            hashes = split_node_hash_value(old.hash_value, prefix.size, self.page_size)
            event_hashes = split_node_hash_value(old.event_hash_value, prefix.size, self.page_size)
            prefix.meta = EventNode(prefix, hashes[0], event_hashes[0])
            tail.meta = EventNode(tail, hashes[1], event_hashes[1])

    def _on_stored(self, node: Node) -> None:
        if self.kv_events.enabled:
            self.kv_events.record_store(event_node(node))

    def _on_evicted(self, node: Node) -> None:
        if self.kv_events.enabled:
            self.kv_events.record_remove(event_node(node))

    def _on_cleared(self) -> None:
        self.kv_events.record_all_cleared()

    # ----- requests -----

    def checkpoint(self, req: Req, *, up_to: int, **kwargs: Any) -> None:
        """Insert the request's KV up to row position `up_to`, repoint its row onto the tree's copy,
        move its lock to the node the insert ended on and advance `cache_protected_len`.

        Frees the slots the tree already held (the duplicates this insert exposed); the rest of the
        row is the scheduler's to free (`release_kv_cache`).
        """
        if self.disable:
            return
        kv = req.kv
        token_ids = req.full_untruncated_fill_ids[:up_to]
        kv_indices = self.req_to_token_pool.req_to_token[kv.req_pool_idx, : len(token_ids)]
        query = self._req_query(req, token_ids, len(token_ids))
        key_len = query.length
        values = kv_indices[:key_len].to(dtype=torch.int64, copy=True)
        priority = req.priority or 0
        reinsert = Reinsert.UNCOUNTED if kv.cache_inserted_len > 0 else Reinsert.NO
        prefix_len = self._insert(query, values, priority, reinsert).prefix_len
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        # Split the leaf at the prompt boundary so eviction can drop the output KV without the
        # prompt; re-inserting a prefix only changes the topology.
        prompt = self._req_query(req, token_ids, min(len(req.origin_input_ids), len(token_ids)))
        if 0 < prompt.length < key_len:
            self._insert(prompt, values, min(priority + 1, _MAX_PRIORITY), Reinsert.UNCOUNTED)
        self.token_to_kv_pool_allocator.free_segment(
            kv_indices[kv.cache_protected_len : prefix_len], start_pos=kv.cache_protected_len
        )

        handle = self._repoint_row(req, query, kv.req_pool_idx, kv.cache_protected_len)
        new_indices = handle.values
        # Page size > 1: the unaligned tail stays in the row but not in the tree; cache_protected_len
        # marks the tree-owned part so the next checkpoint or release_kv_cache frees the rest.
        kv.cache_protected_len = len(new_indices)
        self.unlock(req.lock)
        req.lock = self.lock(handle.node)
        req.last_node = handle.node

    def on_release(self, req: Req, *, checkpointed: bool) -> None:
        self._handles.pop(req, None)
