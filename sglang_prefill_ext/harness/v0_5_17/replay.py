"""SGLang 0.5.17's prefill path on CPU pools with no model: what `bench/replay/schedule_replay.py` drives.

Each version's `replay` module offers the same functions; the replay itself (traces, event loop,
slot census) is version-free. 0.5.17 keeps a request's KV state on the `Req` (`req_pool_idx`,
`cache_protected_len`), caches a chunk with `maybe_cache_unfinished_req`, and its paged allocator
runs a Triton kernel, replaced here by SGLang's own reference `alloc_extend_naive`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, alloc_extend_naive
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.runtime_context import publish
from sglang.srt.utils import get_num_new_pages

from sglang_prefill_ext.harness import common
from sglang_prefill_ext.harness.common import ReplaySpec, replay_scheduler, tree_cache_context_args


class CpuPagedAllocator(PagedTokenToKVPoolAllocator):
    """SGLang's paged allocator with its own reference `alloc_extend_naive` in place of the Triton kernel."""

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        if num_new_pages is None:
            num_new_pages = get_num_new_pages(
                seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu
            )
        if num_new_pages > len(self.free_pages):
            return None
        out = torch.empty((extend_num_tokens,), dtype=torch.int64)
        alloc_extend_naive(prefix_lens, seq_lens, last_loc, self.free_pages, out, self.page_size, self.device)
        self.free_pages = self.free_pages[num_new_pages:]
        return out


def new_scheduler(spec: ReplaySpec) -> Scheduler:
    """The prefill path of a scheduler launched as `spec` says, on the CPU."""
    server_args = spec.server_args()
    publish(server_args, role="test")
    params = spec.cache_params(server_args, paged_allocator=CpuPagedAllocator)
    ctx = TreeCacheBuildContext(
        **tree_cache_context_args(server_args, spec.page_size, params),
        effective_chunked_prefill_size=spec.chunked_prefill_size,
    )
    return replay_scheduler(
        spec,
        server_args,
        create_tree_cache(ctx),
        lambda req: len(req.prefix_indices),
        enable_dynamic_chunking=False,
    )


def extend_range(req: Req) -> tuple[int, int]:
    """The prompt positions the batch just scheduled computes for `req`."""
    return req.extend_range.start, req.extend_range.end


def holds_kv(req: Req) -> bool:
    return req.req_pool_idx is not None


def protected_len(req: Req) -> int:
    """Tokens of `req`'s row the tree owns (matched or inserted)."""
    return req.cache_protected_len


def owned_slots(scheduler: Scheduler, req: Req) -> torch.Tensor:
    """The KV slots `req` holds beyond what the tree owns."""
    row = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx]
    return row[req.cache_protected_len : req.kv.kv_allocated_len]


def free_pages(allocator: Any) -> torch.Tensor:
    """The allocator's free pages in the order it hands them out."""
    return torch.cat((allocator.free_pages, allocator.release_pages))


def finish_prefill(scheduler: Scheduler, batch: ScheduleBatch, output_token: int) -> list[Req]:
    """`process_batch_result_prefill` for a model that emits `output_token`: the requests it finished."""
    return common.finish_prefill(
        batch,
        output_token,
        lambda req: release_kv_cache(req, scheduler.tree_cache),
        lambda req: maybe_cache_unfinished_req(req, scheduler.tree_cache),
    )


def finish_decode(scheduler: Scheduler, batch: ScheduleBatch, output_token: int) -> list[Req]:
    """`process_batch_result_decode` for a model that emits `output_token`: the requests it finished."""
    return common.finish_decode(batch, output_token, lambda req: release_kv_cache(req, scheduler.tree_cache))


abort_chunked = common.abort_chunked


@contextlib.contextmanager
def as_rank(scheduler: Scheduler, **ranks: int) -> Iterator[None]:
    """`scheduler` seen as the given TP / PP / CP ranks (e.g. `attn_tp_rank=1`)."""
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState

    scheduler.ps = ParallelState.trivial(**ranks)
    try:
        yield
    finally:
        del scheduler.ps
