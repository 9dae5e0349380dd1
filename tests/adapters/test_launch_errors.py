"""A refused `--prefill-ext-*` configuration stops SGLang's real `launch_server` with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_prefill_ext.patching import PatchSet


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (("--prefill-ext-dedup", "false"), "error: --prefill-ext-dedup given without --enable-prefill-ext"),
        (
            ("--enable-prefill-ext", "--prefill-ext-pass-cost", "1,2"),
            "error: --prefill-ext-pass-cost='1,2': expected FIXED_MS,TOKEN_US,PAIR_PS (three numbers >= 0)",
        ),
    ],
)
def test_refused_flag_prints_one_line_without_traceback(
    patched_sglang: PatchSet, flags: tuple[str, ...], error: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "dummy", *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [error]
