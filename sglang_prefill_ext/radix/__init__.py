"""A prefix tree that replaces SGLang's RadixCache: version-free core plus per-version adapters.

The core (`PrefixTree`) imports neither sglang nor torch; `make_sglang_cache` builds the adapter for
the installed SGLang (`sglang_prefill_ext.adapters.current`).
"""

from __future__ import annotations

from typing import Any

from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tree import InsertOutcome, PrefixTree

__all__ = ["InsertOutcome", "MatchHandle", "Node", "PrefixTree", "make_sglang_cache"]


def make_sglang_cache(page_size: int = 1, **kw: Any) -> Any:
    """A simulated `PrefillExtRadixCache` for the installed SGLang; keywords as `RadixCache.create_simulated`.

    Raises LookupError, naming the supported versions, when the installed SGLang has no adapter.
    """
    from sglang_prefill_ext import adapters  # the adapter imports sglang; the core does not

    return adapters.current("radix_cache").PrefillExtRadixCache.create_simulated(page_size=page_size, **kw)
