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
from types import ModuleType

import pytest

from sglang_prefill_ext.config import OptionError
from sglang_prefill_ext.patching import PatchSet

ENABLE = "--enable-prefill-ext"
# kind of refusal -> the flags it is launched with (tests/test_config.py pins each kind's message)
REFUSED = {
    "without the enable flag": ("--prefill-ext-dedup", "false"),
    "text with a format": (ENABLE, "--prefill-ext-pass-cost", "1,2"),
    "choice": (ENABLE, "--prefill-ext-eviction", "bogus"),
    "int": (ENABLE, "--prefill-ext-sparse-block-size", "abc"),
    "float": (ENABLE, "--prefill-ext-sparse-mass", "abc"),
    "bool": (ENABLE, "--prefill-ext-dedup", "maybe"),
    "SparseSettings range": (ENABLE, "--prefill-ext-sparse-block-size", "100"),
    "per-layer text": (ENABLE, "--prefill-ext-sparse-layer-stride", "7-20=3"),
    "SparseSettings across flags": (
        *(ENABLE, "--prefill-ext-sparse-layer-stride", "7-20=4", "--prefill-ext-sparse-per-layer", "false"),
    ),
    "negative count": (ENABLE, "--prefill-ext-dedup-min-tokens", "-1"),
    "sparse on a backend it cannot serve": (ENABLE, "--prefill-ext-sparse", "--attention-backend", "triton"),
    "blend on pages of 16 (0.5.23: not ported)": (ENABLE, "--prefill-ext-blend", "--page-size", "16"),
    "layer slices under the overlap loop": (ENABLE, "--prefill-ext-yield-layers", "4"),
    "layer slices with pdmux's own": (
        *(ENABLE, "--prefill-ext-yield-layers", "4", "--disable-overlap-schedule", "--enable-pdmux"),
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
        yield {kind: pool.submit(_launch, flags) for kind, flags in REFUSED.items()}


@pytest.mark.parametrize("kind", REFUSED)
def test_refused_flag_prints_one_line_without_traceback(
    launches: dict[str, Future[subprocess.CompletedProcess[str]]], sglang_harness: ModuleType, kind: str
) -> None:
    """The line is the OptionError the same flags raise in-process, through SGLang's own parsing and
    validation."""
    with pytest.raises(OptionError) as refused:
        sglang_harness.parse_server_args(*REFUSED[kind])
    result = launches[kind].result()
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "usage:" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {refused.value}"]
