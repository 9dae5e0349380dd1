"""Without CUDA, run the ops' Triton kernels under Triton's CPU interpreter (set before they load)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
