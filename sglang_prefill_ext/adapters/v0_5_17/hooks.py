"""The functions SGLang 0.5.17 calls once patched; each patch hook is a single call into here.

This module is imported by the patched `sglang.srt.server_args`, so it imports nothing from
SGLang at module level (that would be circular) and nothing heavy.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sglang_prefill_ext import config

if TYPE_CHECKING:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    from sglang.srt.server_args import ServerArgs

# ServerArgs flags whose meaning the extension's prefix tree would silently override.
_CONFLICTING_FLAGS = {
    "disable_radix_cache": "--disable-radix-cache (the extension is a radix cache)",
    "radix_cache_backend": "--radix-cache-backend (the extension installs its own tree cache)",
    "enable_hierarchical_cache": "--enable-hierarchical-cache",
    "enable_lmcache": "--enable-lmcache",
    "enable_flexkv": "--enable-flexkv",
    "enable_session_radix_cache": "--enable-session-radix-cache",
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    config.add_cli_args(parser)


def validate_server_args(server_args: ServerArgs) -> None:
    """Refuse, before any model loads, a configuration the extension cannot serve correctly."""
    if not server_args.enable_prefill_ext:
        if server_args.prefill_ext_options:
            flags = ", ".join(f"--prefill-ext-{k.replace('_', '-')}" for k in server_args.prefill_ext_options)
            raise ValueError(f"{flags} given without {config.ENABLE_FLAG}")
        return
    config.PrefillExtConfig.from_options(server_args.prefill_ext_options)
    conflicts = [text for name, text in _CONFLICTING_FLAGS.items() if getattr(server_args, name, None)]
    if conflicts:
        raise ValueError(f"{config.ENABLE_FLAG} cannot be combined with: {'; '.join(conflicts)}")


def build_tree_cache(ctx: TreeCacheBuildContext) -> BasePrefixCache:
    from sglang_prefill_ext.adapters.v0_5_17.tree_cache import build_tree_cache as build

    return build(ctx)


def extension_enabled(server_args: Any) -> bool:
    return bool(getattr(server_args, "enable_prefill_ext", False))
