"""scripts/apply_patch.sh from the checkout, with a Python that has nothing installed (`-S`: no
site-packages), on a pristine copy of the real SGLang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sglang_prefill_ext.patching import PatchSet, supported_versions
from tests.patching.test_patch_set import REPO, record_mismatches, tree_hashes

SCRIPT = REPO / "scripts" / "apply_patch.sh"


def bare_python(tmp_path: Path) -> Path:
    """An interpreter that finds this package only through the script's PYTHONPATH."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def script(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = str(python)
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False)


def test_round_trip_matches_the_record(tmp_path: Path, sglang_site: Path, sglang_version: str) -> None:
    python = bare_python(tmp_path)
    where = (sglang_version, str(sglang_site))
    before = tree_hashes(sglang_site)
    assert record_mismatches(sglang_site, sglang_version) == []

    def status() -> str:
        result = script(python, "status", *where)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert status() == f"SGLang {sglang_version} in {sglang_site}: not applied"
    applied = script(python, "apply", *where)
    assert applied.returncode == 0, applied.stderr
    targets = sorted(t.diff.path for t in PatchSet(sglang_version, sglang_site).targets)
    assert record_mismatches(sglang_site, sglang_version) == targets
    assert f"imports sglang_prefill_ext only with PYTHONPATH={REPO}" in applied.stderr
    assert status().endswith(": applied")
    reverted = script(python, "revert", *where)
    assert reverted.returncode == 0, reverted.stderr
    assert record_mismatches(sglang_site, sglang_version) == []
    assert status().endswith(": not applied")
    assert tree_hashes(sglang_site) == before


def test_unknown_version_refused_and_nothing_written(tmp_path: Path, sglang_site: Path) -> None:
    before = tree_hashes(sglang_site)
    result = script(bare_python(tmp_path), "apply", "0.4.0", str(sglang_site))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no patches for SGLang 0.4.0" in result.stderr
    assert all(v in result.stderr for v in supported_versions())
    assert tree_hashes(sglang_site) == before


def test_python_without_sglang_is_named_with_the_knob_to_change_it(tmp_path: Path) -> None:
    """A Python that imports no SGLang (`-S`: no site-packages) and no folder given: one line naming
    `PYTHON=`, the way to pick another interpreter, and nothing run."""
    python = bare_python(tmp_path)
    result = script(python, "status")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{python} imports no sglang package" in result.stderr
    assert "PYTHON=/path/to/python" in result.stderr
