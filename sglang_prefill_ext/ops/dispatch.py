"""What every op's Triton/torch twins share.

Convention: op `X` dispatches to `X_triton` (where `triton_enabled`) or `X_torch`, two functions of
one signature that tests hold equal. `FLOOR` is the finite stand-in for -inf of log-space values
(a log-sum-exp over nothing, a logit margin that keeps every block), where -inf would give NaN.
"""

from __future__ import annotations

import os

import torch

FLOOR = -1.0e30


def triton_enabled(tensor: torch.Tensor) -> bool:
    """True when the Triton version of an op can take `tensor` (CUDA, or TRITON_INTERPRET=1)."""
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
