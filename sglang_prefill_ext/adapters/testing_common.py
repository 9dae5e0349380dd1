"""CPU test harness pieces that SGLang 0.5.17 and 0.5.23 share (same constructors, same types).

Each version's `testing` module re-exports these beside its own differences; tests reach them
through `sglang_prefill_ext.adapters.current("testing")`.
"""

from __future__ import annotations

import argparse
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


def cpu_cache_params(eviction_policy: str, page_size: int = 1, size: int = 256) -> CacheInitParams:
    """Real CPU pools: `size` KV slots and 8 request rows of 128 tokens."""
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(size, torch.bfloat16, "cpu", None, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.bfloat16, "cpu", None, need_sort=False)
    return CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(8, 128, "cpu", enable_memory_saver=False),
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
