"""Version-free block-sparse prefill ops: block layout, block scoring (antidiagonal sums, the default;
sampled rows; pooled Q/K), mass selection, guard, FlashInfer plan and run.

Plan once, run many (like FlashInfer's wrappers): one `SparsePrefill` per server, `begin` once per
forward, `attend` per layer (the policy: dense layers, per-layer selection or reuse of the first plan,
decline; all from `SparseSettings`)::

    sparse = SparsePrefill.create(SparseSettings(), workspace)  # workspace: FlashInfer's float buffer
    layout = BlockLayout.build(prefix_lens, extend_lens, sparse.settings.block_size, device)
    sparse.begin(layout, context_locs(layout, req_to_token, req_pool_indices))
    for index, (q, k_buffer, v_buffer) in enumerate(layers):  # this layer's K/V already in the pool
        out = sparse.attend(q, k_buffer, v_buffer, sm_scale, layer=index)
        if out is None:  # a dense layer, or declined: the caller's dense attention runs this layer
            ...

The names below load on first use, so `ops.settings` (what `config` reads its sparse defaults from)
imports without torch, Triton or FlashInfer.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BlockLayout": "layout",
    "BlockSparseAttention": "attention",
    "SparsePrefill": "policy",
    "SparseSettings": "settings",
    "context_locs": "layout",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
