"""The pass-cost refit: known constants come back from the TTFTs they predict, and from a pass log's
lone chunks; only lone, uncached prompts of a request log count, only a pass log's overlapped lone chunks;
too few lengths is one line and exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lib import cost_fit
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


def _pass(index: int, t_ms: float, reqs: list[list[int]], **fields: object) -> dict:
    return dict(index=index, t_ms=t_ms, reqs=reqs, **fields)


def overlapped_chunks(truth: PassCost, chunks: list[int]) -> list[dict]:
    """A lone prompt's chunks as the overlap loop logs them: the second formed as the first is
    launched, each later one once the one two before it finished."""
    rows, ends, context = [], [0.0], 0
    for i, n in enumerate(chunks):
        t = ends[-2] + 1.0 if i >= 2 else float(i)
        rows.append(_pass(i + 1, t, [[n, context, int(i < len(chunks) - 1)]]))
        ends.append(max(ends[-1], t) + truth.fixed_ms + truth.variable_ms(n, context))
        context += n
    return rows


def test_a_pass_logs_lone_chunks_recover_known_constants() -> None:
    truth = PassCost(11.0, 20.0, 920.0)
    rows = overlapped_chunks(truth, [8192, 6000, 4096, 3000, 2048, 8192, 1024, 512, 4096])
    samples = cost_fit.chunk_samples(rows)
    assert [n for n, _, _ in samples] == [8192, 6000, 4096, 3000, 2048, 8192, 1024]
    got = cost_fit.fit_chunks(samples)
    assert (got.fixed_ms, got.token_us, got.pair_ps) == pytest.approx((11.0, 20.0, 920.0), rel=1e-3)


def test_passes_with_company_riding_decodes_or_a_sync_gap_are_not_timed() -> None:
    rows = overlapped_chunks(PassCost(), [4096] * 6)
    rows[1]["reqs"].append([512, 0, 0])  # a short beside chunk 2
    rows[3]["riding"] = 3
    rows[5]["synced"] = True
    assert cost_fit.chunk_samples(rows) == []


def test_the_h200_pass_log_puts_a_pass_at_9_to_13_ms(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's reading of the 2026-12-03 run (each extra pass cost 9-13 ms, not 5), from the log."""
    got = cost_fit.fit_pass_log(cost_fit.H200_PASS_LOG)
    assert 9.0 <= got.fixed_ms <= 13.0
    assert fpc.main(["--pass-log", str(cost_fit.H200_PASS_LOG)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"--prefill-ext-pass-cost {got}\n(from 189 timed lone chunks")
