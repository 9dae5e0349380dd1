"""The ops tests' fixtures (tests/conftest.py sets Triton's CPU interpreter without CUDA)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator

import pytest


@pytest.fixture
def flashinfer_version(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The flashinfer-python version `importlib.metadata` reports (item 0 of the list; default: the
    one the direct planner is written for), whatever the venv holds."""
    from sglang_prefill_ext.ops import attention

    found = [attention.DIRECT_PLAN_FLASHINFER]
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: found[0] if name == "flashinfer-python" else real(name)
    )
    attention.direct_planning_supported.cache_clear()
    yield found
    attention.direct_planning_supported.cache_clear()
