"""bench.serving's TTFT harness without a server: seeded prompts, the summary of a workload's
records, and the report's stock/ext ratios through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lib.client import Record
from bench.lib.goodput import Targets
from bench.serving import ttft_bench
from bench.serving.report import summarize_workload
from bench.serving.workloads import WORKLOADS, TokenSource, pressure_names, workload_kind


def test_prompts_depend_only_on_the_seed_and_the_key() -> None:
    tokens = TokenSource(7, 1000, 2000)
    assert tokens.ids(64, "rag", "doc", 0) == TokenSource(7, 1000, 2000).ids(64, "rag", "doc", 0)
    assert tokens.ids(64, "rag", "doc", 0) != tokens.ids(64, "rag", "doc", 1)
    assert tokens.ids(64, "rag") != TokenSource(8, 1000, 2000).ids(64, "rag")
    assert all(1000 <= t < 2000 for t in tokens.ids(4096, "range"))


def test_each_pressure_ratio_is_a_workload_of_the_pressure_kind() -> None:
    assert pressure_names([2.0]) == ["pressure"]
    assert pressure_names([1.5, 3.0]) == ["pressure-1.5x", "pressure-3x"]
    assert {workload_kind(name) for name in pressure_names([1.5, 3.0])} == {"pressure"}


def record(
    ttft_s: float | None, cached: int, reusable: int, t_send: float, error: str | None = None
) -> Record:
    return Record(
        label="stock",
        workload="rag",
        group="doc0",
        idx=0,
        prompt_tokens=1000,
        max_new_tokens=4,
        t_send=t_send,
        ttft_s=ttft_s,
        e2e_s=None if ttft_s is None else ttft_s + 0.3,
        cached_tokens=cached,
        output_tokens=4,
        reusable_tokens=reusable,
        error=error,
    )


def rag_records(ttft_s: float) -> list[Record]:
    """A document read once, then twice hit (once only in part), then a failed request."""
    return [
        record(4 * ttft_s, 0, 0, 0.0),
        record(ttft_s, 900, 900, 0.1),
        record(2 * ttft_s, 400, 900, 0.2),
        record(None, 0, 900, 0.3, error="HTTP 500: boom"),
    ]


def test_summary_counts_hits_recomputed_tokens_and_errors() -> None:
    s = summarize_workload(rag_records(0.1), wall_s=2.0, extra={"arrival_rate_per_s": 8.0}, targets=Targets())
    assert (s["n"], s["errors"], s["error_samples"]) == (4, 1, ["HTTP 500: boom"])
    assert s["hit_rate"] == pytest.approx(1300 / 3000)
    assert s["reuse_hit_rate"] == pytest.approx(1300 / 1800)
    assert s["recomputed_tokens"] == 500
    assert s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["ttfts"] == pytest.approx([0.1, 0.2, 0.4])
    # uncached tokens over the span from the first send (0 s) to the last first token (0.4 s)
    assert s["prefill_tok_s"] == pytest.approx(1700 / 0.4)
    assert s["decode_tok_s_per_req_p50"] == pytest.approx(3 / 0.3)
    assert s["groups"]["doc0"]["ttft_values"] == pytest.approx([0.4, 0.1, 0.2, None])
    assert s["arrival_rate_per_s"] == 8.0


def test_report_of_two_summaries_gives_stock_over_ext(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = []
    for label, ttft_s in (("stock", 0.2), ("ext", 0.1)):
        summary = {
            "label": label,
            "workloads": {"rag": summarize_workload(rag_records(ttft_s), 2.0, {}, Targets())},
        }
        paths.append(tmp_path / f"{label}.json")
        paths[-1].write_text(json.dumps(summary))
    md = tmp_path / "report.md"
    assert ttft_bench.main(["compare", *map(str, paths), "--out-md", str(md)]) == 0
    table = md.read_text()
    assert "| metric | stock | ext | stock/ext |" in table
    assert "| TTFT p50 (s) | 0.400 | 0.200 | 2.00 |" in table
    assert "| recomputed tokens (reusable, not cached) | 500 | 500 | 1.00 |" in table
    assert table in capsys.readouterr().out


def test_list_describes_every_workload(capsys: pytest.CaptureFixture) -> None:
    assert ttft_bench.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    firsts = [line for line in lines if not line.startswith(" ")]  # a docstring may go on
    assert [line.split()[0] for line in firsts] == list(WORKLOADS)
    assert all(len(line.split()) > 1 for line in firsts)
