"""The functions SGLang 0.5.23 calls once patched; each patch hook is a single call into here.

Imported by the patched `sglang.srt.arg_groups.fields.memory` / `server_args` / `pipeline` and
`mem_cache.registry`, so it imports nothing from SGLang at module level and nothing heavy. The
version-free parts live in `sglang_prefill_ext.adapters.common`.

What differs from 0.5.17: the flags are fields of the `memory` namespace struct
(`arg_groups/fields/memory.py`), validation runs in the resolution pipeline
(`ServerArgs.resolve_once`, not `__post_init__`), and 0.5.23's own tree-cache selection chain
reads the published `get_memory()` bag; its default cache is `UnifiedRadixCache`, which some
options require.
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

# 0.5.23 options that only UnifiedRadixCache serves, on top of the common conflicts.
CONFLICTING_FLAGS = common.conflicting_flags(
    enable_unified_cache_external_linker="--enable-unified-cache-external-linker (UnifiedRadixCache only)",
    enable_streaming_session="--enable-streaming-session (UnifiedRadixCache only)",
)


# The tree's and the prefill runner's options; the attention backend's (sparse) is
# hooked into 0.5.17 only so far and refused here by name.
PORTED_OPTIONS = frozenset(
    {
        "eviction",
        "schedule",
        "dedup",
        "dedup_min_tokens",
        "dedup_max_wait_passes",
        "protect_waiting",
        "max_wait_passes",
        "log",
        "log_fingerprints",
        "fingerprint_block",
        "fingerprint_salt",
    }
)


# Why the pass budgets are not: 0.5.23's scheduler patch has no `chunk_budget` / `add_chunked_req`
# hook (its PrefillAdder is built and the chunked request added in code the patch does not touch yet).
_NO_CHUNK_HOOK = "its scheduler patch has no chunk-budget hook yet"
# Chunk blending: a blend plan's extends also need the chunk-budget hook (the chunked request's extend
# capped to each computed run), and 0.5.23's request objects carry no chunk_spans.
_NO_BLEND = (
    "its request objects carry no chunk_spans and its scheduler patch has no chunk-budget hook to run "
    "a blend plan's extends"
)
UNPORTED_WHY = {
    "tbt_target_ms": _NO_CHUNK_HOOK,
    "pass_budget_ms": _NO_CHUNK_HOOK,
    "lone_pass_ms": _NO_CHUNK_HOOK,
    "lone_chunk_sync": "it serves goodput scheduling, which needs the chunk-budget hook, and its overlap "
    "event loop has no lone-chunk hook either",
    "yield_layers": "0.5.23 has SGLang's split prefill, but its scheduler patch has no hook where the "
    "normal event loop launches a batch, and a pass between two layer slices needs the chunk-budget hook",
    "blend": _NO_BLEND,
    "blend_recompute_ratio": _NO_BLEND,
}


def validate_server_args(server_args: ServerArgs) -> None:
    """Refuse, before any model loads, a configuration the extension cannot serve correctly."""
    common.validate_server_args(server_args, CONFLICTING_FLAGS, PORTED_OPTIONS, "0.5.23", UNPORTED_WHY)


def build_tree_cache(ctx: TreeCacheBuildContext) -> BasePrefixCache:
    from sglang_prefill_ext.adapters.v0_5_23.tree_cache import build_tree_cache as build

    return build(ctx)
