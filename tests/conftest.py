"""Shared fixtures: the installed SGLang, patched for the whole session and restored after."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import torch

if not torch.cuda.is_available():
    # Triton picks the interpreter when a kernel is defined: before any test module imports ops/ (blend's do)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_prefill_ext import adapters, harness  # noqa: E402
from sglang_prefill_ext.patching import PatchError, PatchSet, installed_sglang_dir
from sglang_prefill_ext.patching.tree import installed_version


def _cuda_available() -> bool:
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


_PATCHED = pytest.StashKey[PatchSet]()
_WAS_APPLIED = pytest.StashKey[bool]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Patch the venv's SGLang before collection: test modules import sglang at module level, and a
    module imported unpatched stays unpatched for the whole run."""
    try:
        sglang_dir = installed_sglang_dir()
        patches = PatchSet(installed_version(sglang_dir), sglang_dir)
    except PatchError:
        return  # no (supported) SGLang here: the `patched_sglang` fixture says why
    session.stash[_WAS_APPLIED] = patches.status() == "applied"
    try:
        patches.apply()
    except PatchError as e:  # a foreign change in the venv's SGLang: say which, run nothing
        pytest.exit(f"cannot patch the venv's SGLang: {e}", returncode=2)
    session.stash[_PATCHED] = patches


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Revert what `pytest_sessionstart` applied, leaving an already-patched SGLang as it was."""
    patches = session.stash.get(_PATCHED, None)
    if patches is not None and not session.stash[_WAS_APPLIED]:
        patches.revert()


@pytest.fixture(scope="session")
def patched_sglang(request: pytest.FixtureRequest, sglang_dir: Path, sglang_version: str) -> PatchSet:
    """The venv's SGLang with the patches applied (by `pytest_sessionstart`, reverted at the end)."""
    patches = request.session.stash.get(_PATCHED, None)
    if patches is None:
        PatchSet(sglang_version, sglang_dir)  # raises with the reason
        raise RuntimeError("SGLang was not patched at session start")
    return patches


@pytest.fixture(scope="session")
def adapter(sglang_version: str) -> ModuleType:
    """The adapter package for the installed SGLang (`sglang_prefill_ext.adapters.vX_Y_Z`)."""
    return adapters.for_version(sglang_version)


@pytest.fixture(scope="session")
def sglang_harness(patched_sglang: PatchSet) -> ModuleType:
    """The installed version's harness `testing` module: SGLang's own construction code on the CPU, patched."""
    return harness.for_version(patched_sglang.version, "testing")


@pytest.fixture
def sglang_copy(tmp_path: Path, sglang_dir: Path, patched_sglang: PatchSet) -> Path:
    """A pristine private copy of the installed sglang/ package and its dist-info (RECORD), safe to
    damage."""
    copy = tmp_path / "site"
    shutil.copytree(sglang_dir / "sglang", copy / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    dist_info = f"sglang-{patched_sglang.version}.dist-info"
    shutil.copytree(sglang_dir / dist_info, copy / dist_info)
    PatchSet(patched_sglang.version, copy).revert()
    return copy
