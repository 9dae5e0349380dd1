"""The FlashInfer plan keywords every prefill wrapper of this package passes the same way."""

from __future__ import annotations

from typing import Any

import torch


def plan_options(dtype: torch.dtype, sm_scale: float, logits_soft_cap: float = 0.0) -> dict[str, Any]:
    """Scale, soft cap (0 = none, which FlashInfer spells None) and one dtype for Q and KV."""
    return dict(
        sm_scale=sm_scale, logits_soft_cap=logits_soft_cap or None, q_data_type=dtype, kv_data_type=dtype
    )
