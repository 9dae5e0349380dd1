"""The demo's closing summary, read from the two CPU benchmarks' tables, and the third-party
warnings its steps hold back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.replay import demo_summary

REPO = Path(__file__).resolve().parents[1]

REPLAY = """command: python -m bench.replay.schedule_replay --lpm-waiting 128

| trace | mode | prefill tokens | ideal | tokens / ideal | passes | decisions/s | CPU ms / step |
|---|---|---:|---:|---:|---:|---:|---:|
| burst-4k | stock-fcfs | 12,288 | 8,192 | 1.50 | 2 | 2,094 | 4.06 |
| burst-4k | ext-fcfs | 8,192 | 8,192 | 1.00 | 2 | 5,185 | 1.54 |
| unique | stock-fcfs | 48,000 | 48,000 | 1.00 | 6 | 8,652 | 0.40 |
| unique | ext-fcfs | 48,000 | 48,000 | 1.00 | 6 | 2,233 | 1.57 |

| mode | N waiting | first pass ms | next pass ms |
|---|---:|---:|---:|
| stock-lpm | 128 | 9.3 | 8.4 |
| ext-lpm | 128 | 6.4 | 0.7 |
"""

RADIX = """| page | prompt tokens | operation | stock p50 (µs) | prefill-ext p50 (µs) | speed-up |
|---:|---:|---|---:|---:|---:|
| 1 | 32768 | insert | 35.3 | 16.1 | 2.2x |
| 1 | 32768 | evict | 114.2 | 135.9 | 0.8x |
| 16 | 32768 | insert | 38.2 | 15.5 | 2.5x |
| 16 | 32768 | evict | 40.1 | 32.4 | 1.2x |
"""


def test_summary_names_savings_costs_and_the_tree_ratios() -> None:
    replay = demo_summary.replay_lines(REPLAY)
    assert "ext saved on burst-4k (fcfs) 8,192 vs 12,288 (-33%)" in replay[0]
    assert "never more than stock; stock already computes the ideal on unique" in replay[0]
    assert replay[1].startswith(
        "Scheduling CPU per pass: ext slower on 1 of 2 runs (unique (fcfs) 1.57 vs 0.40 ms)"
    )
    assert "ext 0.7 ms vs stock 8.4 ms" in replay[2]
    radix = demo_summary.radix_lines(RADIX)
    assert radix[0].startswith("Prefix tree vs stock RadixCache: insert 2.2-2.5x; evict 0.8-1.2x")
    assert radix[1].startswith("evict below 1x")


STEP = """import logging, sys, warnings
import torch  # torch logs through its own handler, which does not propagate to the root
warnings.warn("a third-party warning")  # this file is outside the project's code
for _ in range(2):
    logging.getLogger("sglang.srt.server_args").warning("Cuda graph is disabled")
logging.getLogger("torch").warning("No CUDA runtime is found")
logging.getLogger("sglang.srt.server_args").error("an error")
logging.getLogger("sglang_prefill_ext.ops").warning("the project's own warning")
print("the step's own line")
sys.exit(3)
"""


def test_demo_step_holds_third_party_warnings_only(tmp_path: Path) -> None:
    step, held = tmp_path / "step.py", tmp_path / "held.txt"
    step.write_text(STEP)
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo_step.py"), str(step)],
        env={**os.environ, "DEMO_HELD": str(held)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 3
    assert result.stdout == "the step's own line\n"
    assert "an error" in result.stderr and "the project's own warning" in result.stderr
    for hidden in ("third-party", "Cuda graph", "No CUDA runtime"):
        assert hidden not in result.stderr
    lines = held.read_text().splitlines()
    assert lines == [
        "UserWarning: a third-party warning",
        "sglang.srt.server_args: Cuda graph is disabled",
        "sglang.srt.server_args: Cuda graph is disabled",
        "torch: No CUDA runtime is found",
    ]
    assert demo_summary.held_line(lines) == (
        "4 third-party warnings (3 distinct) hidden; DEMO_VERBOSE=1 shows them."
    )
    assert demo_summary.held_line([]) is None
