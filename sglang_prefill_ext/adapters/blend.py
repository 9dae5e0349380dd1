"""Chunk blending over a `PrefillExtRadixCache` and SGLang's KV pool (docs/BLEND.md), every version.

The three steps a blended request takes around its prefill, after the tree matched its prefix:

- `plan_of`: look up each span past the match in the chunk store (`tree.chunks`, exact token ids)
  and plan the prompt's computed and reused runs (`blend.plan`), locking nothing; `lock` then makes
  it the request's admission: the entries it reuses count as protected in the cache's sizes until
  `release`;
- `place`: once the request holds slots for everything the tree did not match, write each reused
  run into them, every layer: K re-rotated from its cached positions (`ops.rerotate`), V copied;
- `store`: once the request's KV is computed, copy each looked-up span that missed into slots of
  its own and store it (its position: the span's start). A span another request stored meanwhile
  gives its copy back to the allocator.

What the tree may take of the request is `BlendAdmission.exact_len` tokens: its KV is the full
prefill's up to the first reused token; after it, blended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from sglang_prefill_ext.blend.plan import BlendPlan, Run, lookups, plan
from sglang_prefill_ext.blend.spans import Span
from sglang_prefill_ext.ops.rerotate import rerotate
from sglang_prefill_ext.ops.rope import Rope
from sglang_prefill_ext.radix.node import Node


@dataclasses.dataclass
class BlendAdmission:
    """A request's plan and the store entries it locked (span index -> entry), its namespace and tokens."""

    plan: BlendPlan
    entries: dict[int, Node]
    namespace: Hashable
    tokens: np.ndarray
    spans: tuple[Span, ...]

    @property
    def exact_len(self) -> int:
        return self.plan.exact_len


def check_pool(pool: Any) -> None:
    """Refuse, by name, a KV pool whose buffers `place` cannot address as [slots, heads, head_dim]."""
    refused = []
    if getattr(pool, "use_hnd", False):
        refused.append("the HND KV layout (SGLANG_USE_HND_KVCACHE)")
    if pool.is_quantized_kv_cache or pool.store_dtype != pool.dtype:
        refused.append(f"a quantized KV cache (stored as {pool.store_dtype})")
    if not hasattr(pool, "k_buffer"):
        refused.append(f"{type(pool).__name__} (not a plain MHA pool)")
    if refused:
        raise ValueError("--prefill-ext-blend cannot re-position keys in: " + "; ".join(refused))


def plan_of(
    cache: Any,
    tokens: np.ndarray,
    namespace: Hashable,
    spans: tuple[Span, ...],
    prefix_len: int,
    ratio: float,
) -> BlendAdmission:
    """Plan the prompt `tokens` (int64) past its matched `prefix_len` over the store as it is now,
    with the store entries its reused runs read, locking nothing (`lock` does)."""
    asked = lookups(spans, prefix_len, cache.page_size)
    found: dict[int, Node] = {}
    for lookup in asked:
        key = tokens[lookup.start : lookup.start + lookup.length]
        entry = cache.tree.chunks.match(cache.tree.query(key, namespace))
        if entry is not None:
            found[lookup.index] = entry
    result = plan(len(tokens), prefix_len, spans, asked, {i: e.depth for i, e in found.items()}, ratio)
    entries = {run.span: found[run.span] for run in result.runs if run.reused}
    return BlendAdmission(result, entries, namespace, tokens, spans)


def lock(cache: Any, admission: BlendAdmission) -> BlendAdmission:
    """Lock the store entries `plan_of`'s `admission` reuses (evictable again at `release`): the
    request's admission."""
    for entry in admission.entries.values():
        cache.tree.chunks.lock(entry)
    return admission


def release(cache: Any, admission: BlendAdmission) -> None:
    """The request no longer reads its reused chunks: unlock them (evictable again)."""
    for entry in admission.entries.values():
        cache.tree.chunks.unlock(entry)
    admission.entries = {}


def place(pool: Any, rope: Rope, admission: BlendAdmission, row: torch.Tensor) -> None:
    """Write every reused run into the request's slots `row` (its `req_to_token` row, by position)."""
    check_pool(pool)
    for run in admission.plan.runs:
        if run.reused:
            place_run(pool, rope, admission, run, row)


def place_run(pool: Any, rope: Rope, admission: BlendAdmission, run: Run, row: torch.Tensor) -> None:
    """Write the reused `run` into the request's slots `row` (by position; a pool `check_pool` passed)."""
    start = admission.spans[run.span][0]
    src = admission.entries[run.span].value[run.start - start : run.end - start]
    to_pos = torch.arange(run.start, run.end, device=src.device)
    from_pos = to_pos - run.start + run.cached_start
    write_reused(pool, rope, src, row[run.start : run.end].to(torch.int64), from_pos, to_pos)


def write_reused(
    pool: Any, rope: Rope, src: torch.Tensor, dst: torch.Tensor, from_pos: torch.Tensor, to_pos: torch.Tensor
) -> None:
    """Slots `src` (keys at `from_pos`) into slots `dst` (keys at `to_pos`), every layer of `pool`;
    the layers' keys are rotated in one call, V is copied."""
    heads = pool.k_buffer[0].shape[1]
    keys = torch.cat([k[src] for k in pool.k_buffer], dim=1)
    moved = rerotate(keys, from_pos.to(keys.device), to_pos.to(keys.device), rope)
    for k, part in zip(pool.k_buffer, moved.split(heads, dim=1), strict=True):
        k[dst] = part
    for v in pool.v_buffer:
        v[dst] = v[src]


def copy_kv(pool: Any, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Slots `src` into slots `dst`, K and V, every layer (SGLang's `move_kv_cache` needs a kernel
    set up only with `enable_kv_cache_copy`)."""
    for buffers in (pool.k_buffer, pool.v_buffer):
        for buffer in buffers:
            buffer[dst] = buffer[src]


def store(cache: Any, pool: Any, admission: BlendAdmission, row: torch.Tensor) -> int:
    """Store the spans that missed from the request's computed slots `row`; how many were stored.
    A span is skipped when the pool has no room for it even after eviction."""
    allocator = cache.token_to_kv_pool_allocator
    stored = 0
    for lookup in admission.plan.stores:
        if allocator.available_size() < lookup.length:
            cache.evict(EvictParams(num_tokens=lookup.length - allocator.available_size()))
        slots = allocator.alloc(lookup.length)
        if slots is None:
            continue
        slots = slots.to(torch.int64)
        copy_kv(pool, row[lookup.start : lookup.start + lookup.length].to(torch.int64), slots)
        key = admission.tokens[lookup.start : lookup.start + lookup.length]
        outcome = cache.tree.chunks.insert(cache.tree.query(key, admission.namespace), slots, lookup.start)
        if outcome.stored:
            stored += 1
        else:
            allocator.free(slots)
    return stored
