"""A prefix tree that replaces SGLang's RadixCache: the version-free core.

Imports neither sglang nor torch, nor anything above it in the package; the per-version adapters
(`sglang_prefill_ext.adapters`, whose `make_sglang_cache` builds one for the installed SGLang) wrap it.
"""

from sglang_prefill_ext.radix.handle import MatchHandle
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tree import InsertOutcome, PrefixTree

__all__ = ["InsertOutcome", "MatchHandle", "Node", "PrefixTree"]
