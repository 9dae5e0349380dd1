"""Drive SGLang 0.5.23's own construction code on the CPU, for the version-free test suite.

What differs from 0.5.17: `ServerArgs` are validated by `resolve_once()` (the resolution
pipeline), not on construction; the tree-cache chain reads the process-wide config bags, so the
args are published first (role "scheduler", as the scheduler process does); its default cache is
`UnifiedRadixCache`; `MatchResult` carries `device_prefix_len`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult
from sglang.srt.mem_cache.events import LoRANameTable
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import ServerArgs

from sglang_prefill_ext.harness.common import cli_server_args, tree_cache_context_args
from sglang_prefill_ext.harness.common import cpu_cache_params as cpu_cache_params  # re-exported

# The class stock 0.5.23 builds for a plain model with the extension off; the extension's cache
# is a drop-in for the classic RadixCache, which 0.5.23 still ships and tests against.
STOCK_TREE_CACHE: type[BasePrefixCache] = UnifiedRadixCache
STOCK_RADIX_CACHE = RadixCache


def parse_server_args(*argv: str) -> ServerArgs:
    """`ServerArgs` as `launch_server` gets them, resolved (which runs the extension's validation)."""
    server_args = cli_server_args(*argv)
    server_args.resolve_once()
    return server_args


def tree_cache_context(
    server_args: ServerArgs, page_size: int = 1, **overrides: Any
) -> TreeCacheBuildContext:
    """Publish `server_args` (the chain reads them from there), then the scheduler's
    `TreeCacheBuildContext` for a plain model over real CPU pools; `overrides` replace fields."""
    publish(server_args, role="scheduler")
    return TreeCacheBuildContext(**{**tree_cache_context_args(server_args, page_size), **overrides})


def build_tree_cache(server_args: ServerArgs, page_size: int = 1) -> BasePrefixCache:
    """Run SGLang's own `create_tree_cache` over real CPU pools, as the scheduler does."""
    return create_tree_cache(tree_cache_context(server_args, page_size))


SUPPORTS_CACHE_SALT = True


def radix_key(tokens: Iterable[int], extra_key: str | None = None, cache_salt: str | None = None) -> RadixKey:
    return RadixKey(array("q", tokens), extra_key, cache_salt=cache_salt)


def matched_indices(cache: Any, result: MatchResult) -> torch.Tensor:
    """The KV slots a `match_prefix` result covers (0.5.23 returns only their count)."""
    return cache.path_device_indices(result.last_device_node)[: result.device_prefix_len]


def kv_event_options() -> list[dict[str, Any]]:
    """`CacheInitParams` KV-event settings a differential test runs stock and the extension under:
    off, on, on with extra_key "lora-a" named as a LoRA adapter (its events then carry the name and
    a namespaced hash), and Dynamo's event format (namespaced by extra_key and cache_salt)."""
    lora_names = LoRANameTable()
    lora_names.register(lora_id="lora-a", lora_name="adapter-a")
    return [
        {"enable_kv_cache_events": False},
        {"enable_kv_cache_events": True},
        {"enable_kv_cache_events": True, "kv_event_lora_names": lora_names},
        {"enable_kv_cache_events": True, "dynamo_kv_event_format": True},
    ]
