"""SGLang 0.5.23's prefill path on CPU pools with no model: what `bench/replay/schedule_replay.py` drives.

The same functions as `v0_5_17.replay`. What 0.5.23 does its own way: server args are resolved and
published with this process's ranks (the scheduler reads its page size, micro-batch bound and ranks
from the config bags); a request's KV state lives in `req.kv`, its computed prefix in `prefix_len`
and its chunk end in `extend_end`; a chunk is cached by `checkpoint_kv_cache` and a finished request
released with `release_kv_cache(..., checkpoint=True)`; admission asks the beam coordinator for
held rows; the paged allocator runs its own CPU path (no Triton on this platform), so stock's
allocators serve as they are. Flag off, stock 0.5.23 builds `UnifiedRadixCache`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish

from sglang_prefill_ext.harness import common
from sglang_prefill_ext.harness.common import ReplaySpec, replay_scheduler, tree_cache_context_args


def new_scheduler(spec: ReplaySpec) -> Scheduler:
    """The prefill path of a scheduler launched as `spec` says, on the CPU."""
    server_args = spec.server_args()
    server_args.resolve_once()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    ctx = TreeCacheBuildContext(
        **tree_cache_context_args(server_args, spec.page_size, spec.cache_params(server_args))
    )
    scheduler = replay_scheduler(
        spec,
        server_args,
        create_tree_cache(ctx),
        lambda req: req.prefix_len,
        dynamic_chunk_sizer=None,
        enable_lmcache=False,
        enable_unified_cache_external_linker=False,
        hisparse_coordinator=None,
        processed_tokens_counter=0,
        max_req_len=spec.row_tokens,
        future_map=None,
        # as `Scheduler.__init__`; its overlap loop turns this on to leave requests its queued result
        # finishes out of the next batch, and the replay keeps no result queue to read them from
        enable_skip_finishing_decode=False,
    )
    scheduler.init_beam_coordinator()
    return scheduler


def extend_range(req: Req) -> tuple[int, int]:
    """The prompt positions the batch just scheduled computes for `req`."""
    return req.prefix_len, req.extend_end


def holds_kv(req: Req) -> bool:
    return req.kv.holds_kv


def protected_len(req: Req) -> int:
    """Tokens of `req`'s row the tree owns (matched or inserted)."""
    return req.kv.cache_protected_len


def owned_slots(scheduler: Scheduler, req: Req) -> torch.Tensor:
    """The KV slots `req` holds beyond what the tree owns."""
    kv = req.kv
    return scheduler.req_to_token_pool.req_to_token[
        kv.req_pool_idx, kv.cache_protected_len : kv.kv_allocated_len
    ]


def free_pages(allocator: Any) -> torch.Tensor:
    """The allocator's free pages in the order it hands them out."""
    return allocator.get_all_free_pages()


def finish_prefill(scheduler: Scheduler, batch: ScheduleBatch, output_token: int) -> list[Req]:
    """`process_batch_result_prefill` for a model that emits `output_token`: the requests it finished."""
    return common.finish_prefill(
        batch,
        output_token,
        lambda req: release_kv_cache(req, scheduler.tree_cache, checkpoint=True),
        lambda req: checkpoint_kv_cache(req, scheduler.tree_cache),
    )


def finish_decode(scheduler: Scheduler, batch: ScheduleBatch, output_token: int) -> list[Req]:
    """`process_batch_result_decode` for a model that emits `output_token`: the requests it finished."""
    return common.finish_decode(
        batch, output_token, lambda req: release_kv_cache(req, scheduler.tree_cache, checkpoint=True)
    )


abort_chunked = common.abort_chunked


@contextlib.contextmanager
def as_rank(scheduler: Scheduler, **ranks: int) -> Iterator[None]:
    """This process seen as the given TP / PP / CP ranks (e.g. `attn_tp_rank=1`), in a topology just
    wide enough to hold them."""
    pp_rank, tp_rank, cp_rank = (
        ranks.get("pp_rank", 0),
        ranks.get("attn_tp_rank", 0),
        ranks.get("attn_cp_rank", 0),
    )
    tp_size, cp_size = tp_rank + 1, cp_rank + 1
    with get_parallel().override(
        pp_rank=pp_rank,
        pp_size=pp_rank + 1,
        attn_tp_rank=tp_rank,
        attn_tp_size=tp_size,
        attn_cp_rank=cp_rank,
        attn_cp_size=cp_size,
        tp_rank=cp_rank * tp_size + tp_rank,
        tp_size=tp_size * cp_size,
        moe_tp_size=tp_size * cp_size,
    ):
        yield
