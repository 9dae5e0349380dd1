"""Drive SGLang 0.5.17's own construction code on the CPU, for the version-free test suite.

Every test that needs SGLang's server args, tree-cache selection or stock RadixCache goes
through `sglang_prefill_ext.harness.current("testing")`, so the tests themselves name no version.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.server_args import ServerArgs

from sglang_prefill_ext.harness.common import cli_server_args, tree_cache_context_args
from sglang_prefill_ext.harness.common import cpu_cache_params as cpu_cache_params  # re-exported

# The class stock 0.5.17 builds for a plain model with the extension off.
STOCK_TREE_CACHE: type[BasePrefixCache] = RadixCache
STOCK_RADIX_CACHE = RadixCache


def parse_server_args(*argv: str) -> ServerArgs:
    """`ServerArgs` as `launch_server` gets them (0.5.17 validates them in `__post_init__`)."""
    return cli_server_args(*argv)


def tree_cache_context(
    server_args: ServerArgs, page_size: int = 1, **overrides: Any
) -> TreeCacheBuildContext:
    """The scheduler's `TreeCacheBuildContext` for a plain model over real CPU pools; `overrides`
    replace fields (e.g. `is_hybrid_swa=True`)."""
    fields = tree_cache_context_args(server_args, page_size)
    fields["effective_chunked_prefill_size"] = server_args.chunked_prefill_size
    return TreeCacheBuildContext(**{**fields, **overrides})


def build_tree_cache(server_args: ServerArgs, page_size: int = 1) -> BasePrefixCache:
    """Run SGLang's own `create_tree_cache` over real CPU pools, as the scheduler does."""
    return create_tree_cache(tree_cache_context(server_args, page_size))


SUPPORTS_CACHE_SALT = False


def radix_key(tokens: Iterable[int], extra_key: str | None = None, cache_salt: str | None = None) -> RadixKey:
    if cache_salt is not None:
        raise ValueError("SGLang 0.5.17 radix keys have no cache_salt")
    return RadixKey(array("q", tokens), extra_key)


def matched_indices(cache: Any, result: MatchResult) -> torch.Tensor:
    """The KV slots a `match_prefix` result covers."""
    return result.device_indices


def kv_event_options() -> list[dict[str, Any]]:
    """`CacheInitParams` KV-event settings a differential test runs stock and the extension under."""
    return [{"enable_kv_cache_events": False}, {"enable_kv_cache_events": True}]
