"""Shared fixtures: the installed SGLang, patched for the whole session and restored after."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_prefill_ext.patching import PatchSet, installed_sglang_dir
from sglang_prefill_ext.patching.tree import installed_version


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sglang_dir() -> Path:
    return installed_sglang_dir()


@pytest.fixture(scope="session")
def sglang_version(sglang_dir: Path) -> str:
    return installed_version(sglang_dir)


@pytest.fixture(scope="session")
def patched_sglang(sglang_dir: Path, sglang_version: str) -> Iterator[PatchSet]:
    """The venv's SGLang with the patches applied; reverted at the end if it was not before."""
    patches = PatchSet(sglang_version, sglang_dir)
    was_applied = patches.status() == "applied"
    patches.apply()
    yield patches
    if not was_applied:
        patches.revert()


@pytest.fixture
def sglang_copy(tmp_path: Path, sglang_dir: Path, patched_sglang: PatchSet) -> Path:
    """A pristine private copy of the installed sglang/ package, safe to damage."""
    shutil.copytree(sglang_dir / "sglang", tmp_path / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    PatchSet(patched_sglang.version, tmp_path).revert()
    return tmp_path
