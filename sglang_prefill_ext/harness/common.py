"""The CPU harness pieces SGLang 0.5.17 and 0.5.23 share (same constructors, same types).

Each version's `testing` and `replay` modules build on these beside their own differences; tests
and the replay reach them through `sglang_prefill_ext.harness.current("testing" / "replay")`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.server_args import ServerArgs


def cli_server_args(*argv: str) -> Any:
    """`ServerArgs` from a command line, as `launch_server` builds them (model: dummy)."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "dummy", *argv]))


def cpu_cache_params(
    eviction_policy: str,
    page_size: int = 1,
    size: int = 256,
    rows: int = 8,
    row_tokens: int = 128,
    paged_allocator: type[PagedTokenToKVPoolAllocator] = PagedTokenToKVPoolAllocator,
) -> CacheInitParams:
    """Real CPU pools: `size` KV slots and `rows` request rows of `row_tokens` tokens."""
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(size, torch.bfloat16, "cpu", None, need_sort=False)
    else:
        allocator = paged_allocator(size, page_size, torch.bfloat16, "cpu", None, need_sort=False)
    return CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(rows, row_tokens, "cpu", enable_memory_saver=False),
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy=eviction_policy,
    )


def tree_cache_context_args(server_args: Any, page_size: int, params: Any = None) -> dict[str, Any]:
    """`TreeCacheBuildContext` fields both versions take: a plain model, TP 1, real CPU pools
    (small ones unless `params` brings its own)."""
    return dict(
        server_args=server_args,
        params=params or cpu_cache_params(server_args.radix_eviction_policy, page_size),
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )


@dataclasses.dataclass(frozen=True)
class ReplaySpec:
    """What the CPU schedule replay launches a scheduler with: its command line, the model config
    folder, `pool_tokens` KV slots in pages of `page_size`, `max_running_requests` request rows of
    `row_tokens` tokens; `overlap`: the overlap event loop."""

    argv: tuple[str, ...]
    model_path: str
    pool_tokens: int
    page_size: int
    max_running_requests: int
    row_tokens: int
    chunked_prefill_size: int
    overlap: bool

    def server_args(self) -> Any:
        return cli_server_args(*self.argv, "--model-path", self.model_path)

    def cache_params(self, server_args: Any, **allocator: Any) -> CacheInitParams:
        return cpu_cache_params(
            server_args.radix_eviction_policy,
            self.page_size,
            self.pool_tokens,
            rows=self.max_running_requests,
            row_tokens=self.row_tokens,
            **allocator,
        )


def replay_scheduler(
    spec: ReplaySpec, server_args: Any, tree_cache: Any, prefix_len: Callable[[Any], int], **state: Any
) -> Any:
    """A `Scheduler` that holds only what its prefill path reads (the CPU schedule replay's):
    `tree_cache` over its own pools, the schedule policy made by `init_schedule_policy`, no model,
    no grammar, no LoRA, no disaggregation. `prefix_len(req)`: a request's computed tokens as the
    version spells it; `state` adds what one SGLang version reads beyond."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.constrained.grammar_manager import GrammarManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    s = Scheduler.__new__(Scheduler)
    fields = dict(
        server_args=server_args,
        tree_cache=tree_cache,
        token_to_kv_pool_allocator=tree_cache.token_to_kv_pool_allocator,
        req_to_token_pool=tree_cache.req_to_token_pool,
        page_size=tree_cache.page_size,
        schedule_policy=server_args.schedule_policy,
        enable_hierarchical_cache=False,
        enable_priority_scheduling=False,
        schedule_low_priority_values_first=False,
        is_hybrid_swa=False,
        waiting_queue=[],
        chunked_req=None,
        min_free_slots_delayer=None,
        chunked_prefill_size=spec.chunked_prefill_size,
        max_prefill_tokens=server_args.max_prefill_tokens,
        # as `Scheduler.__init__`: decode requests ride the prefill batch under --enable-mixed-chunk
        is_mixed_chunk=spec.chunked_prefill_size is not None
        and getattr(server_args, "enable_mixed_chunk", False),
        priority_scheduling_preemption_threshold=0,
        max_running_requests=spec.max_running_requests,
        dllm_config=None,
        enable_lora=False,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_hicache_storage=False,
        truncation_align_size=None,
        model_config=ModelConfig(spec.model_path),
        enable_overlap=spec.overlap,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        _pending_chunked_abort_req=None,
        tp_worker=NoModelWorker(),
    )
    for name, value in {**fields, **state}.items():
        setattr(s, name, value)
    s.grammar_manager = GrammarManager.__new__(GrammarManager)
    s.grammar_manager.grammar_queue = []
    s.load_inquirer = PendingTokens(s, prefix_len)
    Scheduler.init_schedule_policy(s)
    return s


class NoModelWorker:
    """What the prefill path reads of the worker: `tp_worker.model_runner.prefill_aware_swa` (and, on
    0.5.23, its `attn_backend`, for a tile size it falls back from)."""

    class model_runner:  # noqa: N801 - mirrors the attribute path SGLang reads
        prefill_aware_swa = False
        attn_backend = None


class PendingTokens:
    """`SchedulerLoadInquirer._get_num_pending_tokens`, the one load query the prefill path makes;
    `prefix_len(req)`: the tokens of `req` already computed, as the version spells it."""

    def __init__(self, scheduler: Any, prefix_len: Callable[[Any], int]) -> None:
        self.scheduler = scheduler
        self.prefix_len = prefix_len

    def _get_num_pending_tokens(self, chunk_deduct: int = 0) -> int:
        s = self.scheduler
        pending = sum(r.seqlen for r in s.waiting_queue)
        if s.chunked_req is not None:
            pending += s.chunked_req.seqlen - self.prefix_len(s.chunked_req) - chunk_deduct
        return pending


class NoTokenizer:
    """The abort path notifies the tokenizer; the replay has none (`ipc_channels`)."""

    class send_to_tokenizer:  # noqa: N801 - mirrors the attribute path SGLang reads
        @staticmethod
        def send_output(*args: object) -> None:
            return None


def abort_chunked(scheduler: Any) -> None:
    """SGLang's abort of the request being chunked (`process_pending_chunked_abort`)."""
    scheduler._pending_chunked_abort_req = scheduler.chunked_req
    scheduler.ipc_channels = NoTokenizer()
    scheduler.rust_server = None  # 0.5.23 asks whether the tokenizer side is Rust's
    type(scheduler).process_pending_chunked_abort(scheduler)


def finish_decode(batch: Any, output_token: int, release: Callable[[Any], None]) -> list[Any]:
    """`process_batch_result_decode` for a model that emits `output_token`; `release(req)` caches a
    finished request as the version does. Returns the requests it finished."""
    finished = []
    for req in batch.reqs:
        if req.finished():  # overlap: finished by its prefill's result after joining this decode
            continue
        req.output_ids.append(output_token)
        req.update_finish_state()
        if req.finished():
            release(req)
            finished.append(req)
    return finished


def finish_prefill(
    batch: Any, output_token: int, release: Callable[[Any], None], checkpoint: Callable[[Any], None]
) -> list[Any]:
    """`process_batch_result_prefill` for a model that emits `output_token`; `release(req)` and
    `checkpoint(req)` cache a finished and a continuing request as the version does. Returns the
    requests it finished."""
    finished = []
    decoding = getattr(batch, "decoding_reqs", None) or ()  # a mixed batch's decode requests
    for req in batch.reqs:
        if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
            continue
        if req.inflight_middle_chunks > 0:
            req.inflight_middle_chunks -= 1
            continue
        req.time_stats.set_prefill_finished_time()
        req.output_ids.append(output_token)
        req.update_finish_state()
        if req.finished():
            release(req)
            finished.append(req)
        elif req not in decoding:
            checkpoint(req)
    return finished
