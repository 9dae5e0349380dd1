"""A prefix tree that replaces SGLang's RadixCache: version-free core plus per-version adapters.

The core (`PrefixTree`) imports neither sglang nor torch; `make_sglang_cache` builds the adapter for
the installed SGLang.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import version
from typing import Any

from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tree import InsertOutcome, PrefixTree

ADAPTERS = {"0.5.17": "sglang_prefill_ext.adapters.v0_5_17.radix_cache"}

__all__ = ["ADAPTERS", "InsertOutcome", "MatchHandle", "Node", "PrefixTree", "make_sglang_cache"]


def make_sglang_cache(page_size: int = 1, **kw: Any) -> Any:
    """A simulated `PrefillExtRadixCache` for the installed SGLang; keywords as `RadixCache.create_simulated`."""
    installed = version("sglang")
    if installed not in ADAPTERS:
        raise RuntimeError(f"no prefix-tree adapter for sglang {installed}; supported: {sorted(ADAPTERS)}")
    adapter = import_module(ADAPTERS[installed])
    return adapter.PrefillExtRadixCache.create_simulated(page_size=page_size, **kw)
