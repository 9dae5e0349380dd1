"""The patched SGLang's own argument parsing and tree-cache construction, on the CPU."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from sglang_prefill_ext.patching import PatchSet

pytestmark = pytest.mark.usefixtures("patched_sglang")


def parse(*argv: str):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "dummy", *argv]))


def build_tree_cache(server_args, page_size: int = 1):
    """Run SGLang's own `create_tree_cache` over real CPU pools, as the scheduler does."""
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache

    if page_size == 1:
        allocator = TokenToKVPoolAllocator(256, torch.bfloat16, "cpu", None, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(256, page_size, torch.bfloat16, "cpu", None, need_sort=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(8, 128, "cpu", enable_memory_saver=False),
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy=server_args.radix_eviction_policy,
    )
    ctx = TreeCacheBuildContext(
        server_args=server_args,
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        effective_chunked_prefill_size=server_args.chunked_prefill_size,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    return create_tree_cache(ctx)


def test_launch_server_help_lists_the_flags(patched_sglang: PatchSet) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--enable-prefill-ext" in out
    assert "--prefill-ext-eviction" in out
    assert "sglang-prefill-ext" in out


def test_flag_off_is_stock() -> None:
    args = parse()
    assert args.enable_prefill_ext is False
    assert args.prefill_ext_options is None


def test_flags_reach_server_args() -> None:
    args = parse("--enable-prefill-ext", "--prefill-ext-eviction", "cost")
    assert args.enable_prefill_ext is True
    assert args.prefill_ext_options == {"eviction": "cost"}


def test_bad_option_value_is_an_argparse_error() -> None:
    with pytest.raises(SystemExit):
        parse("--enable-prefill-ext", "--prefill-ext-eviction", "random")


def test_options_without_the_enable_flag_refused() -> None:
    with pytest.raises(ValueError, match="without --enable-prefill-ext"):
        parse("--prefill-ext-eviction", "cost")


@pytest.mark.parametrize(
    "conflict",
    [["--disable-radix-cache"], ["--radix-cache-backend", "flexkv"], ["--enable-hierarchical-cache"]],
)
def test_conflicting_cache_flags_refused(conflict: list[str]) -> None:
    with pytest.raises(ValueError, match="cannot be combined with"):
        parse("--enable-prefill-ext", *conflict)


@pytest.mark.parametrize("page_size", [1, 16])
def test_stock_tree_cache_with_flag_off(page_size: int) -> None:
    from sglang.srt.mem_cache.radix_cache import RadixCache

    assert type(build_tree_cache(parse(), page_size)) is RadixCache


@pytest.mark.parametrize("page_size", [1, 16])
def test_extension_tree_cache_with_flag_on(page_size: int) -> None:
    from sglang_prefill_ext.adapters.v0_5_17.radix_cache import PrefillExtRadixCache

    cache = build_tree_cache(parse("--enable-prefill-ext", "--prefill-ext-eviction", "cost"), page_size)
    assert type(cache) is PrefillExtRadixCache
    assert cache.page_size == page_size
    assert cache.evictable_size() == 0 and cache.protected_size() == 0
