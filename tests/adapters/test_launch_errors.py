"""A refused `--prefill-ext-*` configuration stops SGLang's real `launch_server` with one line.

One launch per kind of refusal (each takes SGLang's import time, ~10 s of CPU): they run side by
side, as many at once as there are cores, the first time a test asks for its result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from sglang_prefill_ext.patching import PatchSet

ENABLE = "--enable-prefill-ext"
REFUSALS = {
    "without the enable flag": (
        ("--prefill-ext-dedup", "false"),
        "error: --prefill-ext-dedup given without --enable-prefill-ext",
    ),
    "text with a format": (
        (ENABLE, "--prefill-ext-pass-cost", "1,2"),
        "error: --prefill-ext-pass-cost='1,2': expected FIXED_MS,TOKEN_US,PAIR_PS (three numbers >= 0)",
    ),
    "choice": (
        (ENABLE, "--prefill-ext-eviction", "bogus"),
        "error: --prefill-ext-eviction='bogus': choose from lru, lfu, fifo, mru, filo, priority, slru, cost, reuse",
    ),
    "int": (
        (ENABLE, "--prefill-ext-sparse-block-size", "abc"),
        "error: --prefill-ext-sparse-block-size='abc': expected an integer",
    ),
    "float": (
        (ENABLE, "--prefill-ext-sparse-mass", "abc"),
        "error: --prefill-ext-sparse-mass='abc': expected a finite number",
    ),
    "bool": (
        (ENABLE, "--prefill-ext-dedup", "maybe"),
        "error: --prefill-ext-dedup='maybe': expected true or false",
    ),
    "SparseSettings range": (
        (ENABLE, "--prefill-ext-sparse-block-size", "100"),
        "error: --prefill-ext-sparse-block-size=100: block_size must be a power of two, got 100",
    ),
    "negative count": (
        (ENABLE, "--prefill-ext-dedup-min-tokens", "-1"),
        "error: --prefill-ext-dedup-min-tokens=-1: must be >= 0",
    ),
}


def _launch(flags: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "dummy", *flags],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def launches(patched_sglang: PatchSet) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        yield {kind: pool.submit(_launch, flags) for kind, (flags, _) in REFUSALS.items()}


@pytest.mark.parametrize("kind", REFUSALS)
def test_refused_flag_prints_one_line_without_traceback(
    launches: dict[str, Future[subprocess.CompletedProcess[str]]], kind: str
) -> None:
    result = launches[kind].result()
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "usage:" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [REFUSALS[kind][1]]
