"""Builds the extension's prefix tree from SGLang 0.5.23's TreeCacheBuildContext, or says why not.

The patch calls `build_tree_cache` in place of 0.5.23's selection chain under
`--enable-prefill-ext`. That chain's default is `UnifiedRadixCache`; the extension replaces it for
plain full-attention models and refuses every configuration that needs the unified tree's
components (SWA, Mamba, DSA sidecars), HiCache, or an external cache, reading the resolved
`memory` / `disagg` config bags as 0.5.23's own chain does.
"""

from __future__ import annotations

from sglang.srt.mem_cache.registry import TreeCacheBuildContext
from sglang.srt.runtime_context import get_disagg, get_memory

from sglang_prefill_ext.adapters.tree_backed import build_checked
from sglang_prefill_ext.adapters.v0_5_23.radix_cache import PrefillExtRadixCache


def refused_settings(ctx: TreeCacheBuildContext) -> list[str]:
    """Settings under which the extension cannot stand in for 0.5.23's tree cache, by name."""
    memory = get_memory()
    checks = {
        "--disable-radix-cache (there is no prefix tree to replace)": ctx.disable_radix_cache,
        "hybrid SWA models (sliding-window attention)": ctx.is_hybrid_swa,
        "hybrid SSM/Mamba models": ctx.is_hybrid_ssm,
        "DSA models (sparse-attention index cache)": ctx.is_dsa,
        "--enable-hierarchical-cache (HiCache)": ctx.enable_hierarchical_cache,
        "--enable-lmcache": memory.enable_lmcache,
        "--enable-flexkv": memory.enable_flexkv,
        f"--radix-cache-backend={memory.radix_cache_backend}": memory.radix_cache_backend,
        "--enable-session-radix-cache": memory.enable_session_radix_cache,
        "--enable-unified-cache-external-linker": memory.enable_unified_cache_external_linker,
        "--disaggregation-decode-retraction-backup=host_pool": (
            get_disagg().disaggregation_decode_retraction_backup == "host_pool"
        ),
    }
    return [name for name, on in checks.items() if on]


def build_tree_cache(ctx: TreeCacheBuildContext) -> PrefillExtRadixCache:
    return build_checked(PrefillExtRadixCache, ctx, refused_settings(ctx))
