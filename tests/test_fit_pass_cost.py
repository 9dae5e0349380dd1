"""The pass-cost refit: known constants come back from the TTFTs they predict; only lone, uncached
prompts of a request log count; too few lengths is one line and exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving import fit_pass_cost as fpc
from sglang_prefill_ext.runner.pass_cost import PassCost


def _row(
    workload: str, group: str, tokens: int, ttft_s: float, cached: int = 0, error: str | None = None
) -> dict:
    return dict(
        workload=workload, group=group, prompt_tokens=tokens, ttft_s=ttft_s, cached_tokens=cached, error=error
    )


def test_known_constants_are_recovered() -> None:
    truth = PassCost(7.0, 20.0, 900.0)
    samples = [(n, fpc.predicted_s(truth, n, 8192)) for n in (1024, 8192, 32768, 100000) for _ in range(2)]
    got = fpc.fit(samples, 8192)
    assert got.fixed_ms == pytest.approx(7.0, rel=1e-3)
    assert got.token_us == pytest.approx(20.0, rel=1e-3)
    assert got.pair_ps == pytest.approx(900.0, rel=1e-3)


def test_a_constant_the_data_would_make_negative_is_held_at_zero() -> None:
    """TTFTs exactly proportional to the token count: no fixed cost, no attention term."""
    got = fpc.fit([(n, n * 25e-6) for n in (1024, 8192, 32768)], 8192)
    assert (got.fixed_ms, got.pair_ps) == (0.0, 0.0) and got.token_us == pytest.approx(25.0, rel=1e-3)


def test_only_lone_uncached_prompts_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = PassCost()
    rows = [
        _row("baseline", f"{n // 1024}K first", n, fpc.predicted_s(truth, n, 8192))
        for n in (1024, 8192, 32768)
    ]
    rows += [_row("unique", "unique", 100000, fpc.predicted_s(truth, 100000, 8192))]
    rows += [
        _row("baseline", "8K hit", 8192, 0.03, cached=8191),  # a cache hit
        _row("baseline", "16x(4K+256) burst", 4352, 0.4),  # concurrent
        _row("burst", "burst", 4352, 1.6),
        _row("baseline", "32K first", 32768, 9.9, error="timeout"),
    ]
    assert sorted(n for n, _ in fpc.alone_samples(rows)) == [1024, 8192, 32768, 100000]
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows))
    assert fpc.main([str(log)]) == 0
    assert capsys.readouterr().out.startswith(f"--prefill-ext-pass-cost {truth}")


def test_too_few_lengths_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text(json.dumps(_row("baseline", "8K first", 8192, 0.2)))
    assert fpc.main([str(log)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "3 or more lengths" in err
