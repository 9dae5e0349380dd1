"""The functions SGLang 0.5.17 calls once patched; each patch hook is a single call into here.

This module is imported by the patched `sglang.srt.server_args`, so it imports nothing from
SGLang at module level (that would be circular) and nothing heavy. The version-free parts live
in `sglang_prefill_ext.adapters.common`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_prefill_ext.adapters import common

if TYPE_CHECKING:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    from sglang.srt.server_args import ServerArgs

add_cli_args = common.add_cli_args
extension_enabled = common.extension_enabled

# 0.5.17 adds no conflicts of its own to the common ones.
CONFLICTING_FLAGS = common.conflicting_flags()


def validate_server_args(server_args: ServerArgs) -> None:
    """Refuse, before any model loads, a configuration the extension cannot serve correctly."""
    common.validate_server_args(server_args, CONFLICTING_FLAGS)


def build_tree_cache(ctx: TreeCacheBuildContext) -> BasePrefixCache:
    from sglang_prefill_ext.adapters.v0_5_17.tree_cache import build_tree_cache as build

    return build(ctx)
