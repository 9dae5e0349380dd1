"""The installed SGLang's real prefill scheduling on CPU pools, stock and under --enable-prefill-ext.

Every replay checks the KV accounting after each scheduler iteration: each slot of the pool has
exactly one owner (allocator free list, tree, or a live request), and the tree's evictable +
protected counters equal the slots it holds.
"""

from __future__ import annotations

import json
from types import ModuleType

import numpy as np
import pytest

from sglang_prefill_ext import adapters
from sglang_prefill_ext.radix.belady import Access, belady

SMALL_CHUNK = 2048
POOL = 1 << 17  # small enough that the per-step slot census stays cheap


def run(replay: ModuleType, trace: list, **config: object) -> object:
    scheduler = replay.ReplayScheduler(replay.ReplayConfig(**{"pool_tokens": POOL, **config}))
    for step in replay.drive(scheduler, trace):
        assert scheduler.kv_accounting_errors() == [], f"after step {step}"
    assert not scheduler.busy()
    assert sorted(scheduler.finished) == sorted(t.rid for t in trace)
    return scheduler


def extend_tokens(scheduler: object) -> int:
    return sum(end - start for step in scheduler.steps for _, start, end in step.admitted)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_burst_computes_the_shared_prefix_once(replay: ModuleType, policy: str, overlap: bool) -> None:
    trace = replay.burst(8, 1024, 64)
    common = {"chunked_prefill_size": SMALL_CHUNK, "schedule_policy": policy, "overlap": overlap}
    stock = run(replay, trace, ext=False, **common)
    ext = run(replay, trace, ext=True, **common)
    ideal = replay.ideal_prefill_tokens(trace)
    assert ideal == 1024 + 8 * 64
    assert extend_tokens(ext) == ext.prefill_tokens == ideal
    assert stock.prefill_tokens > ideal  # the case being fixed: stock computes the prefix several times


def test_long_prefix_burst_stays_ideal(replay: ModuleType) -> None:
    trace = replay.burst(4, 6000, 100)
    ext = run(replay, trace, ext=True, chunked_prefill_size=SMALL_CHUNK)
    assert ext.prefill_tokens == replay.ideal_prefill_tokens(trace)


def test_chunks_are_page_aligned_and_pages_computed_once(replay: ModuleType) -> None:
    page = 16
    trace = replay.burst(6, 1000, 37)
    ext = run(replay, trace, ext=True, page_size=page, chunked_prefill_size=256, pool_tokens=1 << 16)
    lengths = {t.rid: len(t.tokens) for t in trace}
    ranges = [(rid, start, end) for step in ext.steps for rid, start, end in step.admitted]
    assert any(end < lengths[rid] for rid, _, end in ranges), "the trace must chunk"
    for rid, start, end in ranges:
        assert start % page == 0
        assert end % page == 0 or end == lengths[rid]
    assert ext.prefill_tokens == replay.ideal_prefill_tokens(trace, page)


@pytest.mark.parametrize("name", ["shared-doc", "multi-turn", "unique"])
def test_ext_never_computes_more_than_stock(replay: ModuleType, name: str) -> None:
    trace = replay.TRACES[name]()
    stock = run(replay, trace, ext=False, chunked_prefill_size=SMALL_CHUNK)
    ext = run(replay, trace, ext=True, chunked_prefill_size=SMALL_CHUNK)
    assert ext.prefill_tokens <= stock.prefill_tokens
    # Overlaps shorter than --prefill-ext-dedup-min-tokens (64) are recomputed rather than waited for.
    assert ext.prefill_tokens - replay.ideal_prefill_tokens(trace) < 64 * len(trace)


def test_aborting_the_chunked_producer_leaves_waiters_correct(replay: ModuleType) -> None:
    shared, own, n = 4096, 64, 6
    trace = replay.burst(n, shared, own)
    scheduler = replay.ReplayScheduler(
        replay.ReplayConfig(ext=True, chunked_prefill_size=1024, pool_tokens=POOL)
    )
    steps = replay.drive(scheduler, trace)
    next(steps)
    next(steps)
    producer = scheduler.scheduler.chunked_req
    assert producer is not None and producer.rid == "b0"
    waiting = {r.rid for r in scheduler.scheduler.waiting_queue}
    assert waiting == {f"b{i}" for i in range(1, n)}
    landed = scheduler.protected_len(producer)  # the chunks already stashed in the tree
    assert 0 < landed < shared
    scheduler.abort(producer.rid)
    assert scheduler.kv_accounting_errors() == []
    for step in steps:
        assert scheduler.kv_accounting_errors() == [], f"after step {step}"
    assert sorted(scheduler.finished) == sorted(waiting)
    producer_computed = sum(
        end - start for step in scheduler.steps for rid, start, end in step.admitted if rid == "b0"
    )
    # The waiters reuse what landed and compute the rest of the prefix once, between them.
    assert scheduler.prefill_tokens == producer_computed + (shared - landed) + (n - 1) * own
    cache = scheduler.scheduler.tree_cache
    assert cache.evictable_size() + scheduler.scheduler.token_to_kv_pool_allocator.available_size() == (
        scheduler.scheduler.token_to_kv_pool_allocator.size
    )


@pytest.mark.parametrize(("max_wait", "bounded"), [(4, True), (1000, False)])
def test_lpm_aging_bounds_the_wait(replay: ModuleType, max_wait: int, bounded: bool) -> None:
    """One admission per pass; each pass a request with a long cached match arrives. `old` has none."""
    rng = replay.random.Random(5)
    prefix = replay._tokens(rng, 1024)
    trace = [replay.TraceReq("warm", tuple(prefix + replay._tokens(rng, 8)))]
    trace.append(replay.TraceReq("old", tuple(replay._tokens(rng, 200)), arrival=2))
    trace += [
        replay.TraceReq(f"n{i}", tuple(prefix + replay._tokens(rng, 50)), arrival=2 + i) for i in range(30)
    ]
    config = replay.ReplayConfig(
        ext=True,
        schedule_policy="lpm",
        extra_args=("--prefill-max-requests", "1", "--prefill-ext-max-wait-passes", str(max_wait)),
    )
    scheduler = run(replay, trace, **config.__dict__)
    admitted_at = next(
        i for i, step in enumerate(scheduler.steps) if any(rid == "old" for rid, _, _ in step.admitted)
    )
    waited = admitted_at - 2
    assert (waited <= 4) == bounded  # control: without aging, `old` waits until the newcomers stop


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_flag_off_and_neutral_ext_make_stock_decisions(replay: ModuleType, policy: str) -> None:
    """Flag off is the stock path (no runner); the runner with dedup off and stock order decides the same."""
    trace = replay.burst(6, 1024, 64) + replay.shared_doc(2, 3, 700, 50)
    common = {"chunked_prefill_size": SMALL_CHUNK, "schedule_policy": policy}
    stock = run(replay, trace, ext=False, **common)
    assert stock.scheduler.prefill_ext_scheduler is None
    neutral = run(
        replay,
        trace,
        ext=True,
        extra_args=("--prefill-ext-dedup", "false", "--prefill-ext-schedule", "stock"),
        **common,
    )
    assert neutral.scheduler.prefill_ext_scheduler is not None
    assert [s.admitted for s in neutral.steps] == [s.admitted for s in stock.steps]


def test_the_slot_census_catches_leaks_and_double_frees(replay: ModuleType) -> None:
    scheduler = run(replay, replay.burst(2, 128, 16), ext=True)
    allocator = scheduler.scheduler.token_to_kv_pool_allocator
    leaked = allocator.alloc(4)
    assert scheduler.kv_accounting_errors() == ["4 slots have no owner (leaked)"]
    allocator.free(leaked)
    allocator.free(scheduler.scheduler.tree_cache.all_values_flatten()[:1])
    assert scheduler.kv_accounting_errors() == [
        "a slot has two owners (double free, or freed while the tree holds it)"
    ]


def test_request_log_has_one_line_per_request(replay: ModuleType, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    trace = replay.burst(6, 4000, 64)
    scheduler = replay.ReplayScheduler(
        replay.ReplayConfig(
            ext=True, chunked_prefill_size=1024, pool_tokens=POOL, extra_args=("--prefill-ext-log", str(log))
        )
    )
    steps = replay.drive(scheduler, trace)
    next(steps)
    next(steps)
    scheduler.abort(scheduler.scheduler.chunked_req.rid)
    for _ in steps:
        pass
    records = {r["rid"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert sorted(records) == sorted(t.rid for t in trace)
    assert records["b0"]["error"] == "Aborted"
    assert records["b0"]["output_tokens"] == 0
    finished = [records[f"b{i}"] for i in range(1, 6)]
    assert all(r["error"] is None and r["output_tokens"] == 1 for r in finished)
    assert all(r["input_len"] == 4000 + 64 for r in finished)
    # One waiter took over as producer and computed the rest in chunks; every other one deferred behind
    # an in-flight chunk and records what it waited for.
    deduped = [r["deduped_tokens"] for r in finished]
    assert sum(tokens >= 64 for tokens in deduped) >= len(finished) - 1
    assert max(r["chunks"] for r in finished) > 1
    assert all(r["ttft_ms"] >= r["queue_ms"] >= 0 for r in finished)


@pytest.mark.parametrize(
    ("rank", "writes"), [({}, True), ({"attn_tp_rank": 1}, False), ({"pp_rank": 1}, False)]
)
def test_only_the_first_parallel_rank_writes_the_request_log(
    replay: ModuleType, tmp_path, rank: dict[str, int], writes: bool
) -> None:
    adapter = adapters.current("scheduler")
    log = tmp_path / "requests.jsonl"
    replayed = replay.ReplayScheduler(
        replay.ReplayConfig(ext=True, pool_tokens=POOL, extra_args=("--prefill-ext-log", str(log)))
    )
    with replayed.as_rank(**rank):
        glue = adapter.build(replayed.scheduler)
    assert (glue.log is not None) is writes
    assert replayed.scheduler.tree_cache.prefill_ext_scheduler is glue


def test_each_scheduler_writes_its_own_request_log(replay: ModuleType, tmp_path) -> None:
    """Two schedulers in one process (say, two data-parallel ranks): each request's line lands in the
    log of the scheduler that served it, whichever was built last."""
    logs = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    schedulers = [
        replay.ReplayScheduler(
            replay.ReplayConfig(ext=True, pool_tokens=POOL, extra_args=("--prefill-ext-log", str(log)))
        )
        for log in logs
    ]
    for scheduler, requests in zip(schedulers, (2, 3), strict=True):
        for _ in replay.drive(scheduler, replay.burst(requests, 1000, 64)):
            pass
    assert [len(log.read_text().splitlines()) for log in logs] == [2, 3]


def test_prometheus_counters_count_hits_and_dedup(replay: ModuleType) -> None:
    from prometheus_client import REGISTRY

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(f"sglang:prefill_ext_{name}_total") or 0.0

    names = ("hit_tokens", "dedup_tokens", "deferrals")
    before = {name: sample(name) for name in names}
    trace = replay.burst(4, 1024, 64)
    run(replay, trace, ext=True, chunked_prefill_size=SMALL_CHUNK, extra_args=("--enable-metrics",))
    delta = {name: sample(name) - before[name] for name in names}
    assert delta["dedup_tokens"] == 3 * 1024  # three waiters reused the first request's prefix
    assert delta["deferrals"] == 3
    assert delta["hit_tokens"] == 3 * 1024


@pytest.mark.parametrize("eviction", ["lru", "cost", "reuse"])
def test_kv_accounting_holds_under_eviction(replay: ModuleType, eviction: str) -> None:
    """A pool a third of the working set: the tree evicts every few passes; every slot stays owned once."""
    trace = replay.multi_turn(6, 4, 256, 300)
    pool = 2560
    ideal = replay.ideal_prefill_tokens(trace)
    assert ideal > 2.5 * pool
    ext = run(
        replay,
        trace,
        ext=True,
        pool_tokens=pool,
        chunked_prefill_size=1024,
        extra_args=("--prefill-ext-eviction", eviction),
    )
    assert ext.scheduler.tree_cache.stats()["evicted_tokens"] > 0
    assert ext.prefill_tokens > ideal  # evicted prefixes were recomputed


@pytest.mark.parametrize("pool", [16384, 32768])
def test_waiting_prefixes_are_evicted_last_so_ext_never_computes_more(replay: ModuleType, pool: int) -> None:
    """The eviction table's multi-turn trace in pools a quarter and half its working set, fcfs, lru.

    LRU evicts the least recently used context, which is the one of the request that waited longest:
    the queue head, admitted next. Dedup's deferrals reorder the queue, so without
    --prefill-ext-protect-waiting ext computed more than stock at the 32K pool (98,708 vs 94,386).
    """
    trace = replay.EVICTION_TRACES["multi-turn-24x6"]()
    common = {"pool_tokens": pool, "chunked_prefill_size": 8192}
    lru = ("--prefill-ext-eviction", "lru")
    stock = run(replay, trace, ext=False, **common)
    ext = run(replay, trace, ext=True, extra_args=lru, **common)
    unprotected = run(
        replay, trace, ext=True, extra_args=(*lru, "--prefill-ext-protect-waiting", "false"), **common
    )
    assert ext.prefill_tokens < stock.prefill_tokens
    assert ext.prefill_tokens < unprotected.prefill_tokens
    if pool == 32768:
        assert unprotected.prefill_tokens > stock.prefill_tokens  # the case being fixed


@pytest.mark.parametrize("output", [1, 8])
def test_reuse_eviction_keeps_a_loop_of_conversations_whole(replay: ModuleType, output: int) -> None:
    """The pressure phase's shape, scaled down: conversations served round-robin, two at a time,
    final contexts twice the pool. Stock LRU evicts the conversation served next, every turn;
    `reuse` evicts the one served last, so the rest hit, near Belady's optimum. With decodes
    (`output` > 1) each request caches its KV twice (after its prefill, at its finish): one use."""
    pool = 8192
    trace = replay.cyclic_multi_turn(2.0, pool, first=512, tool=768, output=output)
    ideal = replay.ideal_prefill_tokens(trace)
    common = {"pool_tokens": pool, "chunked_prefill_size": 1024}
    stock = run(replay, trace, ext=False, **common)
    ext = run(replay, trace, ext=True, extra_args=("--prefill-ext-eviction", "reuse"), **common)
    lru, ours = stock.prefill_tokens - ideal, ext.prefill_tokens - ideal
    order = replay.admission_order(stock)
    by_rid = {t.rid: t for t in trace}
    accesses = [Access(np.array(by_rid[rid].tokens), len(by_rid[rid].tokens)) for rid in order]
    best = belady(accesses, pool).computed_tokens - ideal
    assert best < ours < 0.7 * lru
    assert (lru - ours) / (lru - best) > 0.5
