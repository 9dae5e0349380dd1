"""Version-free sparse prefill ops: block layout, block selection (pooled Q/K, sampled rows), FlashInfer plan and run.

The names below load on first use, so `ops.settings` (what `config` reads its sparse defaults from)
imports without torch, Triton or FlashInfer.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BlockLayout": "layout",
    "BlockSparseAttention": "attention",
    "SparsePrefill": "sparse_prefill",
    "SparseSettings": "settings",
    "context_locs": "layout",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
