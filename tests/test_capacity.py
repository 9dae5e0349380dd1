"""Goodput capacity: the sweep's order and stopping, the capacity of its points, the arrival plans the
server bench and the replay share, and `bench.serving.capacity run` / `compare` end to end against a
stand-in server whose first tokens come late while it is overloaded."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from bench.lib.arrivals import longs_spanning, mixed_plan, rag_stream_plan
from bench.lib.capacity import STOPPED_MISSES, Point, Sweep, attainment, capacity
from bench.lib.goodput import Targets
from bench.serving import capacity as cap


def point(factor: float, met: int, planned: int = 100, seed: int = 0, stopped: str | None = None) -> Point:
    return Point(factor, 8 * factor, seed, planned, met, met, met, stopped)


def drive(sweep: Sweep, met_at: dict[float, int]) -> list[tuple[float, int]]:
    """Run `sweep` with each factor's seeds meeting `met_at[factor]` of 100 (stopped when that
    already exceeds the miss budget)."""
    ran = []
    for factor, seed in sweep:
        ran.append((factor, seed))
        met = met_at[factor]
        stopped = STOPPED_MISSES if 100 - met > sweep.miss_budget(factor, 100) else None
        sweep.record(point(factor, met, seed=seed, stopped=stopped))
    return ran


def test_sweep_runs_down_from_the_top_and_ends_one_factor_below_the_first_pass() -> None:
    sweep = Sweep([0.5, 2.0, 1.0, 0.25, 1.5], seeds=[0, 1], goal=0.9, below=1)
    ran = drive(sweep, {2.0: 10, 1.5: 85, 1.0: 95, 0.5: 99, 0.25: 100})
    # 2.0 fails at once (its first seed alone misses more than 10 % of both seeds' requests); 1.5's
    # first seed misses 15 of 100, within the 20 two seeds may miss, its second spends the rest
    assert ran == [(2.0, 0), (1.5, 0), (1.5, 1), (1.0, 0), (1.0, 1), (0.5, 0), (0.5, 1)]
    result = capacity(sweep.points, 0.9, 2, base_rate=8.0)
    assert (result.factor, result.rate, result.failing_factor) == (1.0, 8.0, 1.5)


def test_capacity_is_zero_when_no_factor_meets_the_goal() -> None:
    sweep = Sweep([1.0, 0.5], seeds=[0], goal=0.9)
    drive(sweep, {1.0: 50, 0.5: 80})
    assert capacity(sweep.points, 0.9, 1, base_rate=8.0).factor == 0.0


def test_a_factor_passes_only_with_every_seed_run_to_the_end() -> None:
    whole = [point(1.0, 95, seed=0), point(1.0, 95, seed=1)]
    assert attainment(whole) == pytest.approx(0.95)
    assert capacity(whole, 0.9, 2, 1.0).factor == 1.0
    assert capacity(whole[:1], 0.9, 2, 1.0).factor == 0.0  # a seed missing
    stopped = [point(1.0, 95, seed=0), point(1.0, 95, seed=1, stopped="timeout")]
    assert capacity(stopped, 0.9, 2, 1.0).factor == 0.0


def test_the_miss_budget_pools_the_seeds() -> None:
    sweep = Sweep([1.0], seeds=[0, 1, 2], goal=0.9)
    assert sweep.miss_budget(1.0, 100) == 30
    sweep.record(point(1.0, 80, seed=0))
    assert sweep.miss_budget(1.0, 100) == 10  # 300 planned, 30 may miss, 20 did


def test_mixed_plan_spans_its_shorts_with_long_prompts() -> None:
    plan = mixed_plan(random.Random(1), 3, 2.0, 400, 512, 2048, 8.0)
    assert plan.long_s == (0.0, 2.0, 4.0)
    assert len(plan.short_s) == 400 and all(512 <= n <= 2048 for n in plan.short_tokens)
    assert list(plan.short_s) == sorted(plan.short_s)
    # Poisson arrivals at 8/s: 400 of them span ~50 s, the longs one every 2 s over it
    assert longs_spanning(400, 8.0, 2.0) == 26  # 0, 2, ..., 50 s
    assert plan.short_s[-1] == pytest.approx(50.0, rel=0.2)


def test_rag_stream_keeps_cold_documents_arriving_with_zipf_popularity() -> None:
    plan = rag_stream_plan(random.Random(3), 2400, docs=24, zipf=1.0, new_every=24, rate=12.0)
    first_seen = {}
    for i, d in enumerate(plan.doc):
        first_seen.setdefault(d, i)
    colds = sorted(first_seen.values())
    # cold documents in every part of the stream, not only at its start
    assert all(any(lo <= i < lo + 600 for i in colds) for lo in range(0, 2400, 600))
    assert plan.repeats() == 2400 - len(first_seen)
    # a prefix of the plan is the plan of fewer requests
    assert rag_stream_plan(random.Random(3), 100, 24, 1.0, 24, 12.0).doc == plan.doc[:100]


def test_rag_stream_without_new_documents_draws_its_catalogue_by_zipf_rank() -> None:
    plan = rag_stream_plan(random.Random(3), 6000, docs=4, zipf=1.0, new_every=0, rate=12.0)
    counts = collections.Counter(plan.doc)
    assert set(counts) == {0, 1, 2, 3}
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.15)  # Zipf 1: rank 1 twice rank 2
    assert counts[0] / counts[3] == pytest.approx(4.0, rel=0.2)


def test_loosest_ttft_target_bounds_every_cached_split() -> None:
    targets = Targets()
    for prompt in (1000, 4096, 5000, 32768):
        loosest = targets.loosest_ttft_target_s(prompt)
        assert all(targets.ttft_target_s(prompt - c, c) <= loosest for c in range(0, prompt + 1, 256))


# --------------------------------------------------------------------------------------------
# End to end against a stand-in server


class Overloaded:
    """A stand-in SGLang server: the request's streamed tokens, `token_s` apart, the first one `late_s`
    late while more than `limit` requests arrived in the last `window_s`, else at once."""

    def __init__(self, limit: int, window_s: float, late_s: float, token_s: float = 0.0) -> None:
        self.limit, self.window_s, self.late_s, self.token_s = limit, window_s, late_s, token_s
        self.arrivals: collections.deque[float] = collections.deque()
        self.served = 0

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        now = time.monotonic()
        self.arrivals.append(now)
        while self.arrivals and self.arrivals[0] < now - self.window_s:
            self.arrivals.popleft()
        late = len(self.arrivals) > self.limit
        resp = web.StreamResponse()
        await resp.prepare(request)
        await asyncio.sleep(self.late_s if late else len(body["input_ids"]) * 5e-6)
        n = body["sampling_params"]["max_new_tokens"]
        for k in range(1, n + 1):
            if k > 1 and self.token_s:
                await asyncio.sleep(self.token_s)
            meta = {"completion_tokens": k, "prompt_tokens": len(body["input_ids"]), "cached_tokens": 0}
            await resp.write(
                b"data: " + json.dumps({"output_ids": [7] * k, "meta_info": meta}).encode() + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        self.served += 1
        return resp

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"chunked_prefill_size": 8192})


@pytest.fixture
def server() -> Iterator[tuple[str, Overloaded]]:
    yield from serve(Overloaded(limit=25, window_s=0.25, late_s=0.4))


@pytest.fixture
def slow_decoder() -> Iterator[tuple[str, Overloaded]]:
    yield from serve(Overloaded(limit=1000, window_s=0.25, late_s=0.0, token_s=0.004))


def serve(fake: Overloaded) -> Iterator[tuple[str, Overloaded]]:
    ready = threading.Event()
    state: dict = {}

    def host() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/generate", fake.generate)
        app.router.add_get("/health", fake.ok)
        app.router.add_post("/flush_cache", fake.ok)
        app.router.add_get("/server_info", fake.info)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state.update(loop=loop, port=runner.addresses[0][1], runner=runner)
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=host, daemon=True)
    thread.start()
    ready.wait()
    yield f"http://127.0.0.1:{state['port']}", fake
    state["loop"].call_soon_threadsafe(state["loop"].stop)
    thread.join(10)


def test_run_finds_the_capacity_of_an_overloaded_server_and_compare_reports_it(
    server: tuple[str, Overloaded], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url, fake = server
    # base: 80 shorts/s (40 at factor 0.5: ~10 a window, 160 at factor 2: ~40, over the limit of 25)
    argv = [
        "run", "--url", url, "--label", "stock", "--out-dir", str(tmp_path / "stock"), "--workloads", "mixed",
        "--factors", "2,0.5,0.25", "--seeds", "1", "--per-point", "60", "--max-new-tokens", "4",
        "--mixed-short-rate", "80", "--mixed-long-every-s", "0.2", "--mixed-long-tokens", "8192",
        "--mixed-short-min", "64", "--mixed-short-max", "256", "--calibration-lengths", "1024,2048,4096,8192",
        "--long-ttft-factor", "3",
        "--calibration-reps", "1", "--health-timeout", "10",
    ]  # fmt: skip
    assert cap.main(argv) == 0
    result = json.loads((tmp_path / "stock" / "capacity.json").read_text())
    points = result["workloads"]["mixed"]["points"]
    assert [p["factor"] for p in points] == [2.0, 0.5, 0.25]  # one factor below the first pass, then no more
    overloaded = points[0]
    assert overloaded["stopped"] == STOPPED_MISSES and overloaded["completed"] < overloaded["planned"]
    assert points[1]["met"] / points[1]["planned"] >= 0.9 and points[1]["shorts"] >= 60
    assert result["workloads"]["mixed"]["capacity"] == {"factor": 0.5, "rate": 40.0, "failing_factor": 2.0}
    logged = [json.loads(line) for line in (tmp_path / "stock" / "requests.jsonl").read_text().splitlines()]
    assert {(r["factor"], r["seed"]) for r in logged} == {(2.0, 0), (0.5, 0), (0.25, 0)}

    faster = json.loads(json.dumps(result))
    faster["label"] = "ext"
    faster["calibration"]["ttft_s"] = {
        n: [1.01 * t for t in ts] for n, ts in result["calibration"]["ttft_s"].items()
    }
    faster["workloads"]["mixed"]["capacity"] = {"factor": 2.0, "rate": 160.0, "failing_factor": None}
    (tmp_path / "ext.json").write_text(json.dumps(faster))
    predicted = json.loads(json.dumps(result))
    predicted["workloads"]["mixed"]["capacity"]["rate"] = 30.0
    (tmp_path / "replay.json").write_text(json.dumps(predicted))
    png, cdf = tmp_path / "curves.png", tmp_path / "cdf.png"
    argv = ["compare", str(tmp_path / "stock" / "capacity.json"), str(tmp_path / "ext.json")]
    argv += [
        "--predicted",
        f"stock={tmp_path / 'replay.json'}",
        "--out-png",
        str(png),
        "--out-cdf-png",
        str(cdf),
    ]
    assert cap.main(argv) == 0
    out = capsys.readouterr().out
    assert "| stock | 40.00 | 0.5 | 2.0 | 1.00 | 30.00 | 0.75 | 1.00 |" in out
    assert "| ext | ≥ 160.00 | 2 | - | 4.00 |" in out  # its top factor passed: a lower bound
    assert "| stock | ≤" in out  # the stopped point's attainment is an upper bound
    assert "| variant | 1,024 | 2,048 | 4,096 | 8,192 |" in out  # the lone prompts, each run's / stock's
    assert out.count(" (1.010) |") == 4
    assert png.stat().st_size > 0 and cdf.stat().st_size > 0
    at_capacity = cap.at_capacity({**result, "path": str(tmp_path / "stock" / "capacity.json")}, "mixed")
    assert {r["factor"] for r in at_capacity} == {0.5} and len(at_capacity) == points[1]["completed"]


def test_long_requests_are_judged_by_another_runs_time_alone_once_it_is_there(tmp_path: Path) -> None:
    own = Targets()
    a = cap.build_parser().parse_args(
        ["run", "--out-dir", str(tmp_path), "--alone-from", str(tmp_path / "s.json")]
    )
    assert asyncio.run(cap.reference_targets(a, own)) == own  # not there, no wait: this server's own
    (tmp_path / "s.json").write_text(json.dumps({"calibration": {"alone_cost": "9,30,1000", "chunk": 2048}}))
    judged = asyncio.run(cap.reference_targets(a, own))
    assert (str(judged.alone_cost), judged.alone_chunk) == ("9,30,1000", 2048)
    assert judged.short_ttft_target_ms == own.short_ttft_target_ms


def test_the_short_requests_end_to_end_phase_runs_each_output_length_and_compare_gives_its_ratio(
    slow_decoder: tuple[str, Overloaded], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url, _ = slow_decoder
    argv = [
        "run", "--url", url, "--label", "stock", "--out-dir", str(tmp_path / "stock"), "--workloads", "mixed",
        "--factors", "0.5", "--seeds", "2", "--per-point", "10", "--max-new-tokens", "2",
        "--mixed-short-rate", "80", "--mixed-long-every-s", "0.2", "--mixed-long-tokens", "8192",
        "--mixed-short-min", "64", "--mixed-short-max", "256", "--calibration-lengths", "1024,4096,8192",
        "--calibration-reps", "1", "--health-timeout", "10",
        "--e2e-outputs", "4,32", "--e2e-factor", "0.25", "--e2e-per-point", "12", "--e2e-seeds", "2",
    ]  # fmt: skip
    assert cap.main(argv) == 0
    result = json.loads((tmp_path / "stock" / "capacity.json").read_text())
    e2e = result["short_e2e"]
    assert e2e["factor"] == 0.25 and e2e["stopped"] == []
    # every short of both seeds, none of the long prompts; 31 gaps of 4 ms against 3
    assert [len(e2e["e2e_s"][n]) for n in ("4", "32")] == [24, 24]
    assert min(e2e["e2e_s"]["32"]) > 31 * 0.004 > max(e2e["e2e_s"]["4"])
    logged = [json.loads(line) for line in (tmp_path / "stock" / "requests.jsonl").read_text().splitlines()]
    assert {r["factor"] for r in logged} == {0.5}  # the phase's requests are not a sweep point's

    slower = json.loads(json.dumps(result))
    slower["label"] = "ext"
    slower["short_e2e"]["e2e_s"] = {n: [1.5 * t for t in ts] for n, ts in e2e["e2e_s"].items()}
    (tmp_path / "ext.json").write_text(json.dumps(slower))
    assert cap.main(["compare", str(tmp_path / "stock" / "capacity.json"), str(tmp_path / "ext.json")]) == 0
    out = capsys.readouterr().out
    assert (
        "| variant | factor | 4 tokens p50 | 4 tokens p99 | 32 tokens p50 | 32 tokens p99 | shorts |" in out
    )
    assert out.count(" (1.50) |") == 4 and "| 24/24 |" in out
