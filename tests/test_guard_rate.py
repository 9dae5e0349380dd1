"""bench.accuracy.guard_rate: the decline rate at any bound from the sparse path's own log lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.accuracy import guard_rate

REPO = Path(__file__).resolve().parents[1]
PREFIX = "[2026-12-07 03:00:00] "


def _log(*forwards: tuple[float, ...]) -> list[str]:
    """Lines shaped as the sparse path writes them (adapters/v0_5_17/sparse.py `_log`; its own lines are parsed in
    tests/ops/test_backend_dispatch.py), checked layers 0, 7, 14."""
    lines = ["[2026-12-07 03:00:00] Prefill batch, #new-token: 8192"]
    for stats in forwards:
        lines.append(
            f"{PREFIX}prefill-ext sparse: 1 requests, 8192 new tokens, 128 key blocks, density 0.150, guard {stats[0]:.3f}"
        )
        lines += [
            f"{PREFIX}prefill-ext sparse: sparse layer {7 * i}, guard {g:.3f}"
            for i, g in enumerate(stats)
            if i
        ]
    return lines


def test_a_forward_declines_at_its_first_checked_layer_under_the_bound() -> None:
    found = guard_rate.forwards(_log((0.9, 0.6, 0.8), (0.95, 0.9, 0.4), (0.2, 0.9, 0.9)))
    assert [f.guard for f in found] == [
        {0: 0.9, 7: 0.6, 14: 0.8},
        {0: 0.95, 7: 0.9, 14: 0.4},
        {0: 0.2, 7: 0.9, 14: 0.9},
    ]
    assert (found[0].tokens, found[0].density) == (8192, 0.15)
    result = guard_rate.rates(found, [0.1, 0.5, 0.7])
    assert result["bounds"]["0.1"] == dict(declined=0, rate=0.0, layers=[])
    assert result["bounds"]["0.5"] == dict(declined=2, rate=pytest.approx(2 / 3), layers=[0, 14])
    assert result["bounds"]["0.7"] == dict(declined=3, rate=1.0, layers=[0, 7, 14])
    assert result["quantiles"]["7"]["p0"] == pytest.approx(0.6)
    assert result["quantiles"]["0"]["p50"] == pytest.approx(0.9)


def test_a_log_without_guard_lines_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"{PREFIX}prefill-ext sparse: 1 requests, 8192 new tokens, 64 key blocks, density 0.150\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.accuracy.guard_rate", str(log)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "no sparse forward with a guard statistic" in run.stderr


def test_the_command_prints_and_writes_the_rates(tmp_path: Path) -> None:
    log, out = tmp_path / "server.log", tmp_path / "rates.json"
    log.write_text("\n".join(_log((0.9, 0.6), (0.3, 0.9))) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.accuracy.guard_rate", str(log), "--bounds", "0.5", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "bound 0.5: 1 of 2 forwards declined (50.0%), at sparse layers [0]" in run.stdout
    assert '"forwards": 2' in out.read_text()
