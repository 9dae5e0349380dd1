"""Where the Triton kernels run: on CUDA tensors, or anywhere under Triton's CPU interpreter."""

from __future__ import annotations

import os

import torch


def triton_enabled(tensor: torch.Tensor) -> bool:
    """True when the Triton version of an op can take `tensor` (CUDA, or TRITON_INTERPRET=1)."""
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
