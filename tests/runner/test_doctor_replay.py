"""The cache doctor on request logs of the real scheduler (the CPU replay): each planted pattern is
found at its offset with the savings the replay measures by running the fixed layout (within 5 %),
the clean traces get no finding, and the fingerprint flag changes nothing else in the log."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sglang_prefill_ext.doctor import report
from sglang_prefill_ext.doctor.analysis import diagnose
from sglang_prefill_ext.doctor.log import read_log
from sglang_prefill_ext.runner.pass_cost import PassCost
from sglang_prefill_ext.runner.request_log import FingerprintedRecord, RequestRecord
from tests.doctor.cli import doctor

BLOCK = 256


@pytest.fixture(scope="module")
def runs(replay: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("doctor")
    return {name: replay.doctor_run(name, out) for name in replay.DOCTOR_TRACES}


def _report(log: Path) -> dict[str, Any]:
    return report.build([read_log(log)], PassCost())


PLANTED = ["timestamp-front", "shuffled-docs", "system-change", "evicted-docs"]


@pytest.mark.parametrize("name", PLANTED)
def test_each_planted_pattern_is_the_one_finding_with_the_replays_savings(
    replay: ModuleType, runs: dict[str, Any], name: str
) -> None:
    run = runs[name]
    findings = _report(run.log)["findings"]
    assert [f["pattern"] for f in findings] == [replay.DOCTOR_TRACES[name].pattern]
    assert run.saved_tokens > 0
    assert findings[0]["tokens"] == pytest.approx(run.saved_tokens, rel=0.05)
    assert findings[0]["gpu_s"] > 0


def _verdicts(run: Any, pattern: str) -> list[Any]:
    found = [v for v in diagnose(read_log(run.log).requests) if v.pattern == pattern]
    assert found
    return found


def test_the_timestamp_is_found_at_the_front(runs: dict[str, Any]) -> None:
    for v in _verdicts(runs["timestamp-front"], "dynamic"):
        assert v.hit_end == 0
        # the stamp is 6-14 tokens: the shared context shows again within the first anchors (the grid
        # only between two stamps of one length), and all of it but its edges counts
        assert v.resumes_at < 3 * BLOCK
        assert v.saved >= 8000 - 2 * BLOCK


def test_the_changed_line_is_found_where_it_is(runs: dict[str, Any]) -> None:
    (v,) = _verdicts(runs["system-change"], "changed_prefix")
    assert v.rid == "sp8"  # the first request after the change
    assert v.hit_end == 3000  # the line's offset in the system prompt
    assert 3000 < v.resumes_at <= 3000 + 40 + BLOCK


def test_reordered_documents_diverge_at_document_boundaries(runs: dict[str, Any]) -> None:
    docs = (2900, 4100, 3300, 5000, 3700)
    boundaries = {300 + sum(subset) for n in range(len(docs)) for subset in itertools.combinations(docs, n)}
    for v in _verdicts(runs["shuffled-docs"], "reordered"):
        assert v.hit_end in boundaries
        assert v.moved_from != v.moved_to


def test_evictions_name_a_pool_larger_than_the_one_that_evicted(
    replay: ModuleType, runs: dict[str, Any]
) -> None:
    finding = _report(runs["evicted-docs"].log)["findings"][0]
    pools = finding["keep_pool_tokens"]
    trace = replay.EVICTION_TRACES["shared-doc-random"]()
    assert replay.DOCTOR_TRACES["evicted-docs"].pool < pools["all"] <= replay.ideal_prefill_tokens(trace)
    assert pools["p50"] <= pools["all"]


@pytest.mark.parametrize("name", ["shared-doc", "multi-turn", "burst-4k", "unique"])
def test_clean_traces_get_no_finding(runs: dict[str, Any], name: str) -> None:
    result = _report(runs[name].log)
    assert result["findings"] == []
    assert result["fingerprinted"] == result["requests"] > 0
    assert "findings: none" in report.text(result)


def test_the_log_holds_hashes_and_no_token_ids(replay: ModuleType, runs: dict[str, Any]) -> None:
    planted, _ = replay.DOCTOR_TRACES["shuffled-docs"].make()
    prompts = {t.rid: t.tokens for t in planted}
    fields = [f.name for f in dataclasses.fields(FingerprintedRecord)]
    for line in runs["shuffled-docs"].log.read_text().splitlines():
        record = json.loads(line)
        assert list(record) == fields
        tokens = prompts[record["rid"]]
        assert all(re.fullmatch("[0-9a-f]{16}", h) for h in record["fp"] + record["fp_anchored"])
        assert len(record["fp"]) == len(tokens) // BLOCK
        assert all(0 <= a < len(tokens) for a in record["fp_anchors"])
        assert ",".join(map(str, tokens[:3])) not in line


def test_without_the_flag_the_log_is_unchanged(
    replay: ModuleType, runs: dict[str, Any], tmp_path: Path
) -> None:
    """Same trace without --prefill-ext-log-fingerprints: RequestRecord's fields only, the same values
    but for the timings."""
    log = tmp_path / "plain.jsonl"
    planted, _ = replay.DOCTOR_TRACES["system-change"].make()
    config = replay.ReplayConfig(ext=True, extra_args=("--prefill-ext-log", str(log)))
    replay.replay_trace("system-change", planted, config)
    timings = {"queue_ms", "prefill_ms", "ttft_ms"}
    plain = [json.loads(line) for line in log.read_text().splitlines()]
    with_fp = [json.loads(line) for line in runs["system-change"].log.read_text().splitlines()]
    names = [f.name for f in dataclasses.fields(RequestRecord)]
    assert all(list(record) == names for record in plain)
    untimed = [{k: v for k, v in r.items() if k in names and k not in timings} for r in with_fp]
    assert [{k: v for k, v in r.items() if k not in timings} for r in plain] == untimed


def test_the_command_reads_several_logs_as_text_and_json(runs: dict[str, Any]) -> None:
    logs = [str(runs["timestamp-front"].log), str(runs["shared-doc"].log)]
    out = doctor(*logs)
    assert out.returncode == 0, out.stderr
    assert "hit rate:" in out.stdout and "fix: move the part that changes" in out.stdout
    result = json.loads(doctor(*logs, "--json").stdout)
    assert result["logs"] == logs
    assert [(f["log"], f["pattern"]) for f in result["findings"]] == [(logs[0], "dynamic")]


def test_the_png_renders(runs: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "doctor.png"
    out = doctor(str(runs["shuffled-docs"].log), "--png", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "No such file or directory"),
        ("", "no request lines"),
        ('{"rid": "a", "input_len": 3}\nnot json\n', "no valid line of 2 (line 1: 'cached_tokens')"),
    ],
)
def test_a_missing_or_unreadable_log_is_one_line_and_exit_1(
    tmp_path: Path, content: str | None, error: str
) -> None:
    log = tmp_path / "requests.jsonl"
    if content is not None:
        log.write_text(content)
    out = doctor(str(log))
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("sglang-prefill-ext doctor: error: ")
    assert error in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("fingerprints", [True, False])
def test_a_flush_starts_the_doctors_cache_anew(
    replay: ModuleType, tmp_path: Path, fingerprints: bool
) -> None:
    """The same prompt before and after SGLang's cache reset (what /flush_cache calls): the reset is a
    line of the fingerprinted log, and the doctor, which would call the second miss an eviction without
    it, finds nothing; without fingerprints the log has no flush line (and no other change)."""
    log = tmp_path / "requests.jsonl"
    args = ("--prefill-ext-log", str(log)) + (("--prefill-ext-log-fingerprints",) if fingerprints else ())
    scheduler = replay.ReplayScheduler(replay.ReplayConfig(ext=True, pool_tokens=1 << 15, extra_args=args))
    prompt = tuple(range(100, 100 + 4 * BLOCK))
    for rid in ("before", "after"):
        scheduler.add(replay.TraceReq(rid, prompt))
        while scheduler.busy():
            scheduler.step()
        if rid == "before":
            scheduler.scheduler.tree_cache.reset()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    flushes = [line for line in lines if "flush_ms" in line]
    requests = [line for line in lines if "rid" in line]
    assert [r["rid"] for r in requests] == ["before", "after"]
    assert requests[1]["cached_tokens"] == 0  # the reset really emptied the tree
    if not fingerprints:
        assert flushes == []
        return
    assert len(flushes) == 1 and requests[0]["start_ms"] < flushes[0]["flush_ms"] < requests[1]["start_ms"]
    assert _report(log)["findings"] == [] and _report(log)["flushes"] == 1
    without = tmp_path / "without-flush.jsonl"
    without.write_text("".join(json.dumps(r) + "\n" for r in requests))
    assert [f["pattern"] for f in _report(without)["findings"]] == ["evicted"]
