"""SGLang 0.5.23 drop-in for `RadixCache`, backed by the version-free `PrefixTree`.

Same parameter and result types as 0.5.23's stock cache, and the same KV slot accounting. What
0.5.23 changed against 0.5.17, and where this adapter follows it:

- `RadixKey.cache_salt` namespaces the tree like `extra_key`: the core's namespace is
  `extra_key`, or `(extra_key, cache_salt)` when a salt is set;
- `MatchResult` carries `device_prefix_len` (the slots are read with `path_device_indices`);
- `InsertParams.inserted_len` replaces `chunked`: what a request inserted before is not a reuse;
- a running or finishing request is cached by `checkpoint(req, up_to=...)` on `req.kv` (the
  scheduler's `release_kv_cache` frees the row and unlocks `req.lock`), with the prompt boundary
  split off so eviction can drop the output KV first; `on_release` forgets the request.

Sizes, locks, eviction and debug views are shared with 0.5.17 (`adapters.tree_backed`).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_prefill_ext.adapters import tree_backed
from sglang_prefill_ext.adapters.tree_backed import PrefixTreeCacheMixin, TorchValues, pool_device
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.radix.tree import PrefixTree

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

_MAX_PRIORITY = torch.iinfo(torch.int64).max


def unsupported_modes(params: CacheInitParams) -> list[str]:
    """The modes in `params` this cache cannot serve, by name (empty when all is well)."""
    modes = tree_backed.unsupported_modes(params)
    if params.enable_kv_cache_events:
        modes.append("KV cache events (not yet ported to 0.5.23's KVCacheEventRecorder)")
    return modes


def namespace(extra_key: str | None, cache_salt: str | None) -> Hashable:
    """The core's namespace for a 0.5.23 key: `extra_key`, paired with `cache_salt` when salted."""
    return extra_key if cache_salt is None else (extra_key, cache_salt)


class PrefillExtRadixCache(PrefixTreeCacheMixin, BasePrefixCache):
    def __init__(self, params: CacheInitParams, config: PrefillExtConfig | None = None) -> None:
        refused = unsupported_modes(params)
        if refused:
            raise ValueError(f"sglang-prefill-ext prefix tree does not support: {'; '.join(refused)}")
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.is_eagle = False
        self.eviction_policy = ((config and config.eviction) or params.eviction_policy).lower()
        if params.enable_metrics:
            self.init_metrics_collector()
        self.device = pool_device(self.token_to_kv_pool_allocator)
        self.tree = PrefixTree(
            page_size=self.page_size, eviction=self.eviction_policy, values=TorchValues(self.device)
        )
        self._handles: weakref.WeakKeyDictionary[Req, MatchHandle] = weakref.WeakKeyDictionary()
        self.reset()

    @classmethod
    def create_simulated(
        cls, disable: bool = False, mock_allocator: Any | None = None, page_size: int = 1
    ) -> PrefillExtRadixCache:
        """A cache without memory pools, for simulation and tests (stock's keywords, no KV events)."""
        params = CacheInitParams(
            disable=disable,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=mock_allocator,
            page_size=page_size,
        )
        return cls(params)

    def reset(self) -> None:
        self.tree.reset()
        self._handles.clear()

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    # ----- keys -----

    def _query(self, key: RadixKey) -> Query:
        if key.is_bigram:
            raise ValueError("sglang-prefill-ext prefix tree does not support bigram (EAGLE) radix keys")
        return self.tree.query(
            as_token_array(key.token_ids, len(key)), namespace(key.extra_key, key.cache_salt)
        )

    def _req_query(self, req: Req, token_ids: Any, length: int) -> Query:
        return self.tree.query(as_token_array(token_ids, length), namespace(req.extra_key, req.cache_salt))

    def _match_result(self, length: int, node: Any) -> MatchResult:
        return MatchResult(
            device_prefix_len=length, last_device_node=node, last_host_node=node, best_match_node=node
        )

    # ----- match and insert -----

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached prefix of `params.key`; with `params.req`, extends that request's last match."""
        if self.disable or len(params.key) == 0:
            return self._match_result(0, self.tree.root)
        query = self._query(params.key)
        if query.length == 0:
            return self._match_result(0, self.tree.root)
        req = params.req
        handle = self.tree.match(query, self._handles.get(req) if req is not None else None)
        if req is not None:
            self._handles[req] = handle
        return self._match_result(handle.length, handle.node)

    def touch_prefix(self, key: RadixKey) -> None:
        """Refresh recency along `key`'s cached path, as a match does, without returning anything."""
        if self.disable or len(key) == 0:
            return
        query = self._query(key)
        if query.length:
            self.tree.match(query)

    def insert(self, params: InsertParams) -> InsertResult:
        if self.disable:
            return InsertResult(prefix_len=0)
        query = self._query(params.key)
        if params.value is not None:
            value = params.value[: query.length]
        else:
            # Debug/test fallback, as stock: the token ids stand in for slots.
            value = torch.tensor(query.tokens, dtype=torch.int64)
        # 0.5.23 counts no reuse on what the same request inserted before (inserted_len); the core's
        # `chunked` is the closest: a request re-inserting its own earlier part is not a hit.
        outcome = self.tree.insert(query, value, params.priority or 0, chunked=params.inserted_len > 0)
        return InsertResult(prefix_len=outcome.prefix_len, last_device_node=outcome.last_node)

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
        prefix_len = self.tree.insert(query, values, priority, chunked=kv.cache_inserted_len > 0).prefix_len
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        # Split the leaf at the prompt boundary so eviction can drop the output KV without the
        # prompt; re-inserting a prefix only changes the topology.
        prompt = self._req_query(req, token_ids, min(len(req.origin_input_ids), len(token_ids)))
        if 0 < prompt.length < key_len:
            self.tree.insert(prompt, values, min(priority + 1, _MAX_PRIORITY), chunked=True)
        self.token_to_kv_pool_allocator.free_segment(
            kv_indices[kv.cache_protected_len : prefix_len], start_pos=kv.cache_protected_len
        )

        handle = self.tree.match(query, self._handles.get(req))
        self._handles[req] = handle
        new_indices = handle.values
        assert len(new_indices) == key_len, f"{len(new_indices)=}, {key_len=}"
        self.req_to_token_pool.write(
            (kv.req_pool_idx, slice(kv.cache_protected_len, len(new_indices))),
            new_indices[kv.cache_protected_len :],
        )
        # Page size > 1: the unaligned tail stays in the row but not in the tree; cache_protected_len
        # marks the tree-owned part so the next checkpoint or release_kv_cache frees the rest.
        kv.cache_protected_len = len(new_indices)
        self.unlock(req.lock)
        req.lock = self.lock(handle.node)
        req.last_node = handle.node

    def on_release(self, req: Req, *, checkpointed: bool) -> None:
        self._handles.pop(req, None)
