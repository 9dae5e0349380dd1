"""bench.serving.stage_split: client records paired with SGLang's ReqTimeStats lines, TTFT split in stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving import stage_split

# A server whose clock is 1000 s ahead of the client's.
OFFSET = 1000.0


def stats_line(rid: str, input_len: int, cached: int, queue_ms: float, entry: float) -> str:
    return (
        f"[2026-12-01 15:08:35] ReqTimeStats(rid={rid}, input_len={input_len}, cached_input_len={cached}, "
        f"output_len=32, attempts=0, type=unified): queue_duration={queue_ms:.2f}ms, "
        f"forward_duration=250.00ms, entry_time={entry:.3f}"
    )


def record(workload: str, t_send: float, tokens: int, ttft_s: float, cached: int) -> dict:
    return {
        "workload": workload,
        "t_send": t_send,
        "ttft_s": ttft_s,
        "server_prompt_tokens": tokens,
        "cached_tokens": cached,
        "error": None,
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """One variant: a warm-up request, then three rag requests (the second one arrives 4 ms late)."""
    variant = tmp_path / "ext"
    variant.mkdir()
    records = [
        record("warmup", 0.0, 512, 0.030, 0),
        record("rag", 1.000, 16484, 0.500, 0),
        record("rag", 1.200, 16484, 0.030, 16384),
        record("rag", 1.300, 16484, 0.025, 16384),
    ]
    (variant / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    log = [
        "unrelated line",
        stats_line("w", 512, 0, 0.3, OFFSET + 0.001),
        stats_line("a", 16484, 0, 0.5, OFFSET + 1.001),
        stats_line("b", 16484, 16384, 2.0, OFFSET + 1.205),
        stats_line("c", 16484, 16384, 0.5, OFFSET + 1.301),
    ]
    (variant / "server-main.log").write_text("\n".join(log) + "\n")
    return tmp_path


def test_split_measures_front_above_the_fastest_request_and_adds_up(run: Path) -> None:
    records = [json.loads(x) for x in (run / "ext" / "requests.jsonl").read_text().splitlines()]
    rag = [r for r in records if r["workload"] == "rag"]
    splits = [s for _, s in stage_split.split(rag, run / "ext" / "server-main.log")]
    assert [round(s.front_ms, 3) for s in splits] == [0.0, 4.0, 0.0]
    assert [s.queue_ms for s in splits] == [0.5, 2.0, 0.5]
    for s in splits:
        assert s.front_ms + s.queue_ms + s.rest_ms == pytest.approx(s.ttft_ms)
    assert splits[1].rest_ms == pytest.approx(30.0 - 4.0 - 2.0)


def test_report_keeps_hits_only(run: Path) -> None:
    table = stage_split.report([run], "rag", hits=True)
    rows = [line for line in table.splitlines() if line.startswith("| ext |")]
    assert [row.split(" | ")[2] for row in rows] == ["ttft", "front", "queue", "rest"]
    assert all(row.split(" | ")[1] == "2" for row in rows)


def test_unmatched_lengths_are_refused(run: Path) -> None:
    stray = [record("rag", 0.0, 999, 0.02, 0)]
    with pytest.raises(ValueError, match="prompt lengths"):
        stage_split.split(stray, run / "ext" / "server-main.log")


def test_pool_joins_servers_of_one_variant_across_runs(run: Path, tmp_path: Path) -> None:
    second = tmp_path / "second"
    (second / "ext_b").mkdir(parents=True)
    for name in ("requests.jsonl", "server-main.log"):
        (second / "ext_b" / name).write_text((run / "ext" / name).read_text())
    rows = [
        line.split(" | ")[:3]
        for line in stage_split.report([run, second], "rag", hits=True, pool=True).splitlines()
        if line.startswith("| ext")
    ]
    assert rows == [["| ext", "4", stage] for stage in ("ttft", "front", "queue", "rest")]
    apart = stage_split.report([run, second], "rag", hits=True).splitlines()
    assert {line.split(" | ")[0] for line in apart if line.startswith("| ext")} == {"| ext", "| ext_b"}
