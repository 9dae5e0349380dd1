"""`sglang_site`: the pristine SGLang copy with every file of SGLang's RECORD in it."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest


@pytest.fixture
def sglang_site(sglang_copy: Path, sglang_dir: Path, sglang_version: str) -> Path:
    """`sglang_copy` plus the hashed RECORD files outside `sglang/` (0.5.17 also installs `tools/`),
    so that the copy holds every file the RECORD hashes (pip's bin/ scripts aside)."""
    with open(sglang_copy / f"sglang-{sglang_version}.dist-info" / "RECORD", encoding="utf-8") as f:
        names = [name for name, digest, *_ in csv.reader(f) if digest and not name.startswith("../")]
    for name in names:
        if not (sglang_copy / name).exists() and (sglang_dir / name).is_file():
            (sglang_copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(sglang_dir / name, sglang_copy / name)
    return sglang_copy
