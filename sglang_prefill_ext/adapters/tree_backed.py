"""What every version's `PrefillExtRadixCache` does the same way over the version-free `PrefixTree`.

Only names that SGLang 0.5.17 and 0.5.23 both define (same fields, same meaning) are imported from
SGLang here; everything that differs (a key's namespace, MatchResult, what counts as a re-insert, how
a request is cached, KV events) stays in each version's `radix_cache.py`, behind the hooks that
`PrefixTreeCacheMixin` names.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (
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

from sglang_prefill_ext.adapters import common
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.radix.tree import InsertOutcome, PrefixTree, Reinsert, SplitHook

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

CacheT = TypeVar("CacheT")


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


def build_checked(cache_class: type[CacheT], ctx: Any, refused: list[str]) -> CacheT:
    """`cache_class` for a version's `TreeCacheBuildContext` and the extension's flags, or a
    ValueError naming every setting in `refused` (the version's tree-cache builder lists them)."""
    if refused:
        raise ValueError(
            "--enable-prefill-ext replaces SGLang's tree cache and cannot be combined with: "
            + "; ".join(refused)
        )
    return cache_class(ctx.params, common.prefill_ext_config(ctx.server_args))  # type: ignore[call-arg]


def pool_device(allocator: Any) -> torch.device:
    """The device of a KV allocator's slots (the CPU for a simulated cache without one)."""
    device = getattr(allocator, "device", None)
    return torch.device(device) if isinstance(device, (str, torch.device)) else torch.device("cpu")


class PrefixTreeCacheMixin:
    """Set-up, match, insert, sizes, locks, eviction and debugging views of a cache whose state is
    `self.tree`.

    Mixed in before SGLang's `BasePrefixCache`. A version's class calls `_setup` from its
    `__init__` and defines `_namespace` (a key's tree namespace), `_match_result` (its
    `MatchResult`) and `_is_reinsert` (whether an insert re-inserts the caller's own earlier one); it
    may override `_on_stored`, `_on_evicted` and `_on_cleared` to record KV events.
    """

    tree: PrefixTree
    disable: bool
    token_to_kv_pool_allocator: Any
    # The scheduler glue (adapters.scheduling.PrefillExtScheduler) serving from this cache, if any.
    prefill_ext_scheduler: Any = None

    def _setup(
        self, params: CacheInitParams, config: PrefillExtConfig | None, on_split: SplitHook | None = None
    ) -> None:
        """Refuse what no version serves, then the fields and tree every version's cache has."""
        refused = unsupported_modes(params)
        if refused:
            raise ValueError(f"sglang-prefill-ext prefix tree does not support: {'; '.join(refused)}")
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.is_eagle = False
        # No config: the drop-in for SGLang's RadixCache keeps its policy (the differential tests).
        policy = config.tree_eviction(params.eviction_policy) if config else params.eviction_policy
        self.eviction_policy = policy.lower()
        if params.enable_metrics:
            self.init_metrics_collector()  # type: ignore[attr-defined]
        self.device = pool_device(self.token_to_kv_pool_allocator)
        self.tree = PrefixTree(
            page_size=self.page_size,
            eviction=self.eviction_policy,
            values=TorchValues(self.device),
            on_split=on_split,
        )
        self._handles: weakref.WeakKeyDictionary[Req, MatchHandle] = weakref.WeakKeyDictionary()

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: Any | None = None,
        page_size: int = 1,
        **event_options: Any,
    ) -> Any:
        """A cache without memory pools, for simulation and tests: stock's keywords, the KV-event
        ones (`enable_kv_cache_events`, ...) as the version's `CacheInitParams` names them."""
        params = CacheInitParams(
            disable=disable,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=mock_allocator,
            page_size=page_size,
            **event_options,
        )
        return cls(params)  # type: ignore[call-arg]

    # ----- per-version hooks -----

    def _namespace(self, key: Any) -> Hashable:
        """The tree namespace of a version's `RadixKey`."""
        raise NotImplementedError

    def _match_result(self, handle: MatchHandle | None) -> MatchResult:
        """The version's `MatchResult` for a match (None: nothing matched, the root)."""
        raise NotImplementedError

    def _is_reinsert(self, params: InsertParams) -> bool:
        """Whether `params` re-inserts what the same caller inserted before (no hit, no use)."""
        raise NotImplementedError

    def _on_stored(self, node: Node) -> None:
        """Called once per new leaf an insert added."""

    def _on_evicted(self, node: Node) -> None:
        """Called once per evicted tree node (not chunk), after its slots went back to the allocator."""

    def _on_cleared(self) -> None:
        """Called when the tree was emptied by `reset`."""

    # ----- match and insert -----

    def reset(self) -> None:
        self.tree.reset()
        self._handles.clear()
        self._on_cleared()
        glue = getattr(self, "prefill_ext_scheduler", None)  # set once the scheduler is built
        if glue is not None:
            glue.flushed()

    def _query(self, key: Any) -> Query:
        if key.is_bigram:
            raise ValueError("sglang-prefill-ext prefix tree does not support bigram (EAGLE) radix keys")
        return self.tree.query(as_token_array(key.token_ids, len(key)), self._namespace(key))

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached prefix of `params.key`; with `params.req`, extends that request's last match."""
        if self.disable or len(params.key) == 0:
            return self._match_result(None)
        query = self._query(params.key)
        if query.length == 0:
            return self._match_result(None)
        req = params.req
        handle = self.tree.match(query, self._handles.get(req) if req is not None else None)
        if req is not None:
            self._handles[req] = handle
        return self._match_result(handle)

    def insert(self, params: InsertParams) -> InsertResult:
        if self.disable:
            return InsertResult(prefix_len=0)
        query = self._query(params.key)
        if params.value is not None:
            value = params.value[: query.length]
        else:
            # Debug/test fallback, as stock: the token ids stand in for slots.
            value = torch.tensor(query.tokens, dtype=torch.int64)
        reinsert = Reinsert.UNCOUNTED if self._is_reinsert(params) else Reinsert.NO
        outcome = self._insert(query, value, params.priority or 0, reinsert)
        return InsertResult(prefix_len=outcome.prefix_len, last_device_node=outcome.last_node)

    def _insert(self, query: Query, value: torch.Tensor, priority: int, reinsert: Reinsert) -> InsertOutcome:
        outcome = self.tree.insert(query, value, priority, reinsert)
        if outcome.new_leaf is not None:
            self._on_stored(outcome.new_leaf)
        return outcome

    def _repoint_row(self, req: Req, query: Query, row: int, protected_len: int) -> MatchHandle:
        """Re-match `req`'s just-inserted `query` and write the tree's slots into its `req_to_token`
        row from `protected_len` on (the duplicates were freed); the handle ends on the new node."""
        handle = self.tree.match(query, self._handles.get(req))
        self._handles[req] = handle
        new_indices = handle.values
        assert len(new_indices) == query.length, f"{len(new_indices)=}, {query.length=}"
        self.req_to_token_pool.write(
            (row, slice(protected_len, len(new_indices))), new_indices[protected_len:]
        )
        return handle

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
            if node.parent is not None:  # chunks were never stored as KV-event blocks
                self._on_evicted(node)
        num_evicted = sum(node.size for node in evicted)
        self.update_eviction_metrics(num_evicted, start_time)  # type: ignore[attr-defined]
        return EvictResult(num_tokens_evicted=num_evicted)

    # ----- views -----

    def path_device_indices(self, node: Node) -> torch.Tensor:
        """KV slots on the path from the root to `node`."""
        values = [n.value for n in node.path()]
        return self.tree.values.join(values) if values else self.tree.values.empty()

    def all_values_flatten(self) -> torch.Tensor:
        """Every slot the cache owns: the tree's nodes' and its chunk store's."""
        values = [node.value for node in itertools.chain(self.tree.nodes(), self.tree.chunks.entries())]
        return torch.cat(values) if values else self.tree.values.empty()

    def pretty_print(self) -> None:
        stack = [(self.tree.root, 0)]
        while stack:
            node, indent = stack.pop()
            tokens = as_token_array(node.tokens, min(node.size, 10)).tolist()
            print(" " * indent, node.size, tokens, f"r={node.lock_ref}")
            stack.extend((child, indent + 2) for child in node.children.values())
        print(f"#tokens: {self.total_size()}")
