"""Without CUDA, run the ops' Triton kernels under Triton's CPU interpreter (set before they load)."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def flashinfer_version(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The flashinfer-python version `importlib.metadata` reports (item 0 of the list; default: the
    one the direct planner is written for), whatever the venv holds."""
    from sglang_prefill_ext.ops import attention  # after TRITON_INTERPRET is set

    found = [attention.DIRECT_PLAN_FLASHINFER]
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: found[0] if name == "flashinfer-python" else real(name)
    )
    attention.direct_planning_supported.cache_clear()
    yield found
    attention.direct_planning_supported.cache_clear()
