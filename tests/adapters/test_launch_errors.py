"""A refused `--prefill-ext-*` configuration stops SGLang's real `launch_server` with one line."""

from __future__ import annotations

import subprocess
import sys

from sglang_prefill_ext.patching import PatchSet


def test_refused_flag_prints_one_line_without_traceback(patched_sglang: PatchSet) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            "dummy",
            "--prefill-ext-dedup",
            "false",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --prefill-ext-dedup given without --enable-prefill-ext"]
