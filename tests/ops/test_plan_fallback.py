"""Which planner block-sparse prefill uses by the installed FlashInfer version (no GPU needed).

FlashInfer's wrapper needs CUDA to be built, so the routing is checked on an instance whose two
planners record their calls; `test_sparse_gpu.py` checks on the GPU that both plan the same run.
"""

from __future__ import annotations

import importlib.metadata
import types
import warnings
from collections.abc import Iterator

import pytest
import torch

from sglang_prefill_ext.ops import attention
from sglang_prefill_ext.ops.plan import one_segment_indices


@pytest.fixture
def flashinfer_version(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Set the version `importlib.metadata` reports for flashinfer-python (index 0 of the list)."""
    found = [attention.DIRECT_PLAN_FLASHINFER]
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: found[0] if name == "flashinfer-python" else real(name)
    )
    attention.direct_planning_supported.cache_clear()
    yield found
    attention.direct_planning_supported.cache_clear()


def planned_by(fast: bool) -> list[str]:
    """The planners `BlockSparsePrefill.plan` calls for two batches of one kernel signature."""
    prefill = object.__new__(attention.BlockSparsePrefill)
    prefill._signature = None
    prefill._wrapper = types.SimpleNamespace(device=torch.device("cpu"))
    calls: list[str] = []
    prefill._plan_public = lambda indices, signature: calls.append("public")
    prefill._plan_direct = lambda indices, group, head_dim: calls.append("direct")
    for _ in range(2):
        prefill.plan(one_segment_indices("cpu"), 32, 8, 128, torch.bfloat16, 128**-0.5, fast=fast)
    return calls


def test_pinned_flashinfer_plans_directly_without_warning(flashinfer_version: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The public plan runs once, on a one-segment problem, to pick the kernel for the signature.
        assert planned_by(fast=True) == ["public", "direct", "direct"]


def test_other_flashinfer_falls_back_to_the_public_plan_with_one_warning(
    flashinfer_version: list[str],
) -> None:
    flashinfer_version[0] = "0.6.16"
    with pytest.warns(RuntimeWarning, match="flashinfer-python 0.6.16, not 0.6.15.post1") as caught:
        assert planned_by(fast=True) == ["public", "public"]
        assert planned_by(fast=True) == ["public", "public"]
    assert len(caught) == 1
