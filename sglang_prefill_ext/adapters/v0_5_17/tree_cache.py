"""Builds the extension's prefix tree from SGLang 0.5.17's TreeCacheBuildContext, or says why not.

The patch calls `build_tree_cache` in place of the stock selection chain under
`--enable-prefill-ext`; every configuration that would pick another cache class there is refused.
"""

from __future__ import annotations

from sglang.srt.environ import envs
from sglang.srt.mem_cache.registry import TreeCacheBuildContext

from sglang_prefill_ext.adapters.tree_backed import build_checked
from sglang_prefill_ext.adapters.v0_5_17.radix_cache import PrefillExtRadixCache


def refused_settings(ctx: TreeCacheBuildContext) -> list[str]:
    """Settings under which stock 0.5.17 would not build a plain RadixCache, by name."""
    server_args = ctx.server_args
    refused = []
    if ctx.disable_radix_cache:
        refused.append("--disable-radix-cache (there is no prefix tree to replace)")
    if ctx.is_hybrid_swa:
        refused.append("hybrid SWA models (sliding-window attention)")
    if ctx.is_hybrid_ssm:
        refused.append("hybrid SSM/Mamba models")
    if ctx.enable_hierarchical_cache:
        refused.append("--enable-hierarchical-cache (HiCache)")
    if getattr(server_args, "enable_lmcache", False):
        refused.append("--enable-lmcache")
    if getattr(server_args, "enable_flexkv", False):
        refused.append("--enable-flexkv")
    if getattr(server_args, "radix_cache_backend", None):
        refused.append(f"--radix-cache-backend={server_args.radix_cache_backend}")
    if getattr(server_args, "enable_session_radix_cache", False):
        refused.append("--enable-session-radix-cache")
    if envs.SGLANG_EXPERIMENTAL_CPP_RADIX_TREE.get():
        refused.append("SGLANG_EXPERIMENTAL_CPP_RADIX_TREE=1")
    if envs.SGLANG_ENABLE_UNIFIED_RADIX_TREE.get():
        refused.append("SGLANG_ENABLE_UNIFIED_RADIX_TREE=1")
    return refused


def build_tree_cache(ctx: TreeCacheBuildContext) -> PrefillExtRadixCache:
    return build_checked(PrefillExtRadixCache, ctx, refused_settings(ctx))
