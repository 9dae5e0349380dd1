"""Short requests first: the per-pass decisions, and the policy on SGLang's real
scheduler (CPU pools, simulated clock from bench.replay.mixed_replay), KV accounting checked every pass."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

from sglang_prefill_ext.runner.pass_cost import PassCost
from sglang_prefill_ext.runner.short_first import Need, ShortFirst
from tests.runner.conftest import ported

COST = PassCost()


def policy(budget_ms: float = 100.0, window_s: float = 1.0, min_long_chunk: int = 512) -> ShortFirst:
    return ShortFirst(budget_ms, 4096, window_s, min_long_chunk, page_size=1)


def test_select_moves_the_shorts_that_fit_ahead_in_order() -> None:
    needs = {"long": Need(32768, 0), "s1": Need(1500, 0), "doc-q": Need(100, 16384), "s2": Need(3000, 0)}
    needs["next-doc"] = Need(16484, 0)
    waiting = ["long", "s1", "doc-q", "next-doc", "s2"]
    chosen = policy().select(waiting, needs.__getitem__, now=0.0)
    # s1 (34 ms) + doc-q (3.7 ms) fit in 95 ms of variable time; s2 (70 ms) would not.
    assert waiting == ["s1", "doc-q", "long", "next-doc", "s2"]
    assert chosen == [needs["s1"], needs["doc-q"]]


def test_one_short_request_rides_even_when_it_alone_overflows_the_budget() -> None:
    waiting = ["long", "a", "b"]
    needs = {"long": Need(32768, 0), "a": Need(1000, 0), "b": Need(1000, 0)}
    assert policy(budget_ms=20).select(waiting, needs.__getitem__, now=0.0) == [needs["a"]]
    assert waiting == ["a", "long", "b"]


def test_disabled_policy_changes_nothing() -> None:
    off, waiting = policy(budget_ms=0), ["long", "s"]
    assert off.select(waiting, {"long": Need(32768, 0), "s": Need(100, 0)}.__getitem__, now=0.0) == []
    assert waiting == ["long", "s"] and not off.plan(8192, 0.0, [], Need(32768, 0), True).budgeted


def test_plan_fills_the_budget_after_the_shorts_and_keeps_long_progress() -> None:
    p = policy()
    short = Need(1000, 0)
    p.select(["s"], lambda _: short, now=10.0)
    long = Need(20000, 24576)
    plan = p.plan(8192, 10.5, [short], long, continuing=True)
    assert plan.budgeted and plan.long_cap is not None
    assert plan.chunk == 1000 + plan.long_cap
    predicted = COST.fixed_ms + COST.variable_ms(1000, 0) + COST.variable_ms(plan.long_cap, long.context)
    assert predicted <= 100.0 < predicted + COST.variable_ms(1, long.context + plan.long_cap)
    # A budget the shorts use up still leaves the long prompt its minimum chunk.
    crowded = p.plan(8192, 10.6, [Need(3500, 0)], long, continuing=True)
    assert crowded.long_cap == 512
    # Past the window (no short seen for a second), SGLang's chunk size again.
    assert p.plan(8192, 11.6, [], long, continuing=True) == p.plan(8192, 99.0, [], None, continuing=False)
    assert not p.plan(8192, 11.6, [], long, continuing=True).budgeted
    # A negative window budgets every pass.
    always = policy(window_s=-1)
    assert always.plan(8192, 0.0, [], long, continuing=True).long_cap < 8192
    assert p.counters.budgeted_passes == 2 and p.counters.shortened_chunks == 2


def test_config_refuses_a_malformed_cost_model() -> None:
    from sglang_prefill_ext.config import OptionError, PrefillExtConfig

    with pytest.raises(OptionError, match="--prefill-ext-pass-cost"):
        PrefillExtConfig.from_options({"pass_cost": "1,2"})


# ----- on SGLang's real scheduler -----


@pytest.fixture(scope="module")
def mixed(replay: ModuleType) -> ModuleType:
    """bench.replay.mixed_replay, which imports bench.replay.schedule_replay (loaded by `replay`)."""
    return importlib.import_module("bench.replay.mixed_replay")


def small_mixed(mixed: ModuleType) -> list:
    """Two 16K prompts, 0.5 s apart, among ten short ones (stock: shorts' TTFT p50 ~430 ms)."""
    return mixed.mixed(long_n=2, long_tokens=16384, long_every_ms=500, short_n=10, short_rate=10.0, seed=3)


BUDGET = ("--prefill-ext-pass-budget-ms", "60")


@ported("pass_budget_ms")
@pytest.mark.parametrize("overlap", [False, True])
def test_short_requests_stop_waiting_for_the_long_prefill(
    replay: ModuleType, mixed: ModuleType, overlap: bool
) -> None:
    arrivals = small_mixed(mixed)
    common = {"chunked_prefill_size": 4096, "overlap": overlap, "pool_tokens": 1 << 17}
    stock = mixed.run_timed(arrivals, replay.ReplayConfig(ext=False, **common), COST, check_kv=True)
    ext = mixed.run_timed(
        arrivals, replay.ReplayConfig(ext=True, extra_args=BUDGET, **common), COST, check_kv=True
    )
    assert stock.kv_errors == [] and ext.kv_errors == []
    assert len(ext.ttft_ms) == len(stock.ttft_ms) == len(arrivals)
    assert ext.prefill_tokens == stock.prefill_tokens  # the same work, in another order
    stock_short, ext_short = sorted(stock.group_ttfts("short")), sorted(ext.group_ttfts("short"))
    assert ext_short[len(ext_short) // 2] * 2 < stock_short[len(stock_short) // 2]  # ~2.4x / 3.7x
    assert max(ext_short) < max(stock_short)


@ported("pass_budget_ms", "pass_log")
def test_budgeted_passes_cap_the_long_chunk_and_are_logged(
    replay: ModuleType, mixed: ModuleType, tmp_path: Path
) -> None:
    arrivals = small_mixed(mixed)
    passes, requests = tmp_path / "passes.jsonl", tmp_path / "requests.jsonl"
    extra = (*BUDGET, "--prefill-ext-pass-log", str(passes), "--prefill-ext-log", str(requests))
    config = replay.ReplayConfig(ext=True, chunked_prefill_size=4096, pool_tokens=1 << 17, extra_args=extra)
    result = mixed.run_timed(arrivals, config, COST, check_kv=True)
    assert result.kv_errors == []
    records = [json.loads(line) for line in passes.read_text().splitlines()]
    assert len(records) == result.passes
    budgeted = [r for r in records if r["budgeted"]]
    assert budgeted, "the trace must budget passes"
    for r in budgeted:
        assert sum(new for new, _, _ in r["reqs"]) <= r["chunk"]
        # Within the budget, unless the long prompt's minimum chunk (512) or one short alone overflows it.
        if r["predicted_ms"] > 60.0:
            assert any(new <= 512 for new, _, chunked in r["reqs"] if chunked) or len(r["reqs"]) == 1
    # Some pass carries short requests beside a shortened chunk of a long prompt.
    assert any(len(r["reqs"]) > 1 and any(chunked for _, _, chunked in r["reqs"]) for r in budgeted)
    lines = {r["rid"]: r for r in map(json.loads, requests.read_text().splitlines())}
    assert set(lines) == {a.req.rid for a in arrivals}
    assert sum(lines[f"long{i}"]["budgeted_chunks"] for i in range(2)) > 0
    assert all(r["queue_passes"] >= 0 for r in lines.values())


@ported("pass_budget_ms")
@pytest.mark.parametrize("overlap", [False, True])
def test_concurrent_long_prompts_and_large_shorts_keep_one_chunked_request(
    replay: ModuleType, mixed: ModuleType, overlap: bool
) -> None:
    """Long prompts arriving together (RAG documents) and short requests too large for what a capped
    chunk leaves: SGLang 0.5.17 chunks one request at a time (it asserts so), the runner must not make
    it chunk a second one; every request finishes, KV accounting exact."""
    rng = replay.random.Random(11)
    docs = [replay._tokens(rng, 9000) for _ in range(3)]
    arrivals = [
        mixed.Arrival(0.0, replay.TraceReq(f"doc{d}", tuple(docs[d] + [5])), "long") for d in range(3)
    ]
    arrivals += [
        mixed.Arrival(
            30.0 * i,
            replay.TraceReq(f"q{i}", tuple(docs[i % 3] + replay._tokens(rng, 100 + 400 * (i % 9)))),
            "short",
        )
        for i in range(1, 16)
    ]
    arrivals += [
        mixed.Arrival(45.0 * i, replay.TraceReq(f"s{i}", tuple(replay._tokens(rng, 3000 + 97 * i))), "short")
        for i in range(1, 8)
    ]
    arrivals.sort(key=lambda a: a.ms)
    config = replay.ReplayConfig(
        ext=True, chunked_prefill_size=4096, overlap=overlap, pool_tokens=1 << 17, extra_args=BUDGET
    )
    result = mixed.run_timed(arrivals, config, COST, check_kv=True)
    assert result.kv_errors == []
    assert len(result.ttft_ms) == len(arrivals)


@ported("pass_budget_ms")
def test_mixed_chunk_decode_tokens_ride_without_splitting_short_requests(
    replay: ModuleType, mixed: ModuleType
) -> None:
    """Under --enable-mixed-chunk the running requests' decode tokens take chunk budget: the pass
    budget makes room for them (without it the shorts' TTFT tail was 589 ms here), so short requests
    still prefill in one pass and go first; all finish, KV exact. Stock with mixed chunk: p50 428 ms,
    max 770 ms; ext: 116 / 162 ms."""
    arrivals = mixed.mixed(
        long_n=2, long_tokens=16384, long_every_ms=500, short_n=10, short_rate=10.0, seed=3, output=16
    )
    common = {"chunked_prefill_size": 4096, "pool_tokens": 1 << 17}
    stock = mixed.run_timed(
        arrivals, replay.ReplayConfig(ext=False, extra_args=("--enable-mixed-chunk",), **common), COST
    )
    config = replay.ReplayConfig(ext=True, extra_args=(*BUDGET, "--enable-mixed-chunk"), **common)
    result = mixed.run_timed(arrivals, config, COST, check_kv=True)
    assert result.kv_errors == []
    assert set(result.e2e_ms) == {a.req.rid for a in arrivals}
    assert all(result.e2e_ms[rid] >= result.ttft_ms[rid] for rid in result.e2e_ms)
    assert all(result.chunks[a.req.rid] == 1 for a in arrivals if a.group == "short")
    assert max(result.group_ttfts("short")) * 3 < max(stock.group_ttfts("short"))
