"""Running the doctor as a user does."""

from __future__ import annotations

import subprocess
import sys


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    """`sglang-prefill-ext doctor ARGS` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sglang_prefill_ext.cli", "doctor", *args],
        capture_output=True,
        text=True,
        check=False,
    )
