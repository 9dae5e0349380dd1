"""A CPU replay on an SGLang that is not patched stops with one line saying how to patch it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("replay", ["schedule_replay", "mixed_replay"])
def test_replay_on_stock_sglang_prints_one_line(sglang_copy: Path, sglang_version: str, replay: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{sglang_copy}{os.pathsep}{REPO}"}  # the pristine copy first
    result = subprocess.run(
        [sys.executable, "-m", f"bench.replay.{replay}"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: SGLang {sglang_version} in {sglang_copy}: not applied; the replay needs it patched: "
        f"make apply SGLANG_VERSION={sglang_version} (or scripts/apply_patch.sh apply)"
    ]
