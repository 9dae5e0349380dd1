"""Tensor- and data-parallel ranks on the installed SGLang's real scheduler (CPU pools, extension tree).

TP: every rank runs its own scheduler, runner and tree on the same inputs and must decide the same
thing every pass (admissions and their extend ranges, dedup deferrals, chunking, queue order, what
the tree inserts, splits and evicts, which KV slots are handed out), or the ranks' batches diverge
and the collectives hang. The ranks here run in lockstep in one process, so their objects live at
different addresses (id-hashed sets iterate differently); each rank is also nudged differently
(ballast allocations, forced GC). A second check runs ranks in separate interpreters with
different hash seeds, as SGLang's rank processes are.

DP: ranks keep independent trees. Two instances fed different traces, interleaved, decide exactly
what each decides alone.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

Snapshot = dict[str, Any]
Scenario = tuple[Callable[[ModuleType], list], dict[str, Any], dict[int, str]]

# name -> (trace, ReplayConfig fields, {step: what to abort after it, on every rank}).
# In the bursts the producer's last chunk ends past the chunk grid with shared tokens in it and budget
# to spare, so waiters defer behind it on every version (0.5.23 considers no waiter while a chunk
# spends the whole budget).
SCENARIOS: dict[str, Scenario] = {
    "burst-fcfs-aborts": (
        lambda r: r.burst(8, 1400, 64),
        {"chunked_prefill_size": 512, "pool_tokens": 1 << 14},
        {0: "chunked", 1: "waiting"},
    ),
    # Paged + overlap is left out: the replay's slot census sees 18 transiently unowned slots there,
    # stock and ext alike (the replay's census in bench/replay/schedule_replay.py, not the runner).
    "burst-lpm-aging-paged": (
        lambda r: r.burst(6, 1000, 37),
        {"schedule_policy": "lpm", "page_size": 16, "chunked_prefill_size": 384},
        {},
    ),
    "shared-doc-lpm-aging-overlap": (
        lambda r: r.shared_doc(3, 4, 700, 50),
        {"schedule_policy": "lpm", "chunked_prefill_size": 512, "pool_tokens": 1 << 14, "overlap": True},
        {4: "waiting"},
    ),
    "multi-turn-evicting-lru": (
        lambda r: r.multi_turn(4, 4, 256, 300),
        {"chunked_prefill_size": 1024, "pool_tokens": 2048},
        {8: "chunked"},  # c0t3, a last turn: no later turn waits for it
    ),
    "multi-turn-evicting-cost-lpm-aging": (
        lambda r: r.multi_turn(4, 4, 256, 300),
        {
            "schedule_policy": "lpm",
            "chunked_prefill_size": 1024,
            "pool_tokens": 2048,
            "extra_args": ("--prefill-ext-eviction", "cost", "--prefill-ext-max-wait-passes", "3"),
        },
        {},
    ),
}


# ----- what a rank decided, as plain data -----


def _crc(data: bytes) -> int:
    return zlib.crc32(data)


def _node_key(node: Any) -> list[int]:
    """A node by where it sits (depth, end, path tokens), never by its id or address."""
    return [node.depth, node.end, _crc(b"".join(n.tokens for n in node.path()))]


def tree_fingerprint(tree: Any) -> list[Any]:
    """Every node (children in the tree's own order) with its slots, locks, stats and logical times."""
    rows: list[Any] = []
    stack = [tree.root]
    while stack:
        node = stack.pop()
        rows.append(
            [
                *_node_key(node),
                _crc(node.value.numpy().tobytes()) if node.size else 0,
                node.lock_ref,
                node.hit_count,
                node.priority,
                node.last_access,
                node.created,
                len(node.children),
            ]
        )
        stack.extend(reversed(node.children.values()))
    evictable = sorted(_node_key(node) for node in tree.evictable_leaves)
    return [rows, evictable, tree.epoch, tree.counters.as_dict()]


def snapshot(rank: Any) -> Snapshot:
    """One pass of one rank: the scheduler's, the runner's and the tree's state after it."""
    s = rank.scheduler
    runner = s.prefill_ext_scheduler.runner
    allocator = s.token_to_kv_pool_allocator
    cache = s.tree_cache
    return {
        "admitted": [list(a) for a in rank.steps[-1].admitted],
        "waiting": [r.rid for r in s.waiting_queue],
        "chunked": None if s.chunked_req is None else [s.chunked_req.rid, rank.protected_len(s.chunked_req)],
        "runner": runner.counters.as_dict(),
        "flights": [[f.producer.rid, f.start, f.end, _node_key(f.anchor)] for f in runner.flights],
        "states": [
            [req.rid, st.arrival, st.passes, st.dedup_passes, st.deduped_tokens, st.matched]
            for req, st in runner.waiting_states().items()
        ],
        "tree": tree_fingerprint(cache.tree),
        "kv": [
            allocator.available_size(),
            cache.evictable_size(),
            cache.protected_size(),
            _crc(rank.free_pages().numpy().tobytes()),  # which slots come next, in order
        ],
        "prefill_tokens": rank.prefill_tokens,
        "finished": sorted(rank.finished),
    }


# ----- lockstep ranks -----


def _abort_target(rank: Any, what: str) -> str:
    s = rank.scheduler
    if what == "chunked":
        assert s.chunked_req is not None, "the scenario must be chunking when it aborts the producer"
        return s.chunked_req.rid
    assert s.waiting_queue, "the scenario must have a waiting request to abort"
    return s.waiting_queue[-1].rid


def lockstep(
    replay: ModuleType, traces: list[list], config: Any, aborts: dict[int, str] | None = None
) -> list[list[Snapshot]]:
    """Drive one scheduler per trace, one pass each in turn; every rank's snapshot after every pass.

    `aborts[step]` is aborted on every rank after that pass, its rid chosen on rank 0 (a TP abort
    reaches all ranks as the same message). Rank k allocates k * 97 objects of ballast per pass and
    odd ranks force a GC every 8 passes, so no two ranks share addresses or collection timing.
    """
    aborts = aborts or {}
    ranks = [replay.ReplayScheduler(config) for _ in traces]
    drives = [replay.drive(rank, trace) for rank, trace in zip(ranks, traces, strict=True)]
    logs: list[list[Snapshot]] = [[] for _ in ranks]
    ballast: list[list[object]] = []
    live = list(range(len(ranks)))
    aborted: dict[int, str] = {}
    while live:
        for i in list(live):
            ballast.append([object() for _ in range(i * 97)])
            if i % 2 and len(logs[i]) % 8 == 0:
                gc.collect()
            step = next(drives[i], None)
            if step is None:
                live.remove(i)
                continue
            if step in aborts:
                if i == 0:
                    aborted[step] = _abort_target(ranks[0], aborts[step])
                ranks[i].abort(aborted[step])
            logs[i].append(snapshot(ranks[i]))
            assert ranks[i].kv_accounting_errors() == [], f"rank {i} after step {step}"
    for rank in ranks:
        assert not rank.busy()
        allocator = rank.scheduler.token_to_kv_pool_allocator
        assert rank.scheduler.tree_cache.evictable_size() + allocator.available_size() == allocator.size
    assert sorted(aborted) == sorted(aborts), "every planned abort happened"
    return [json.loads(json.dumps(log)) for log in logs]  # tuples -> lists, as a subprocess's come back


def scenario_config(replay: ModuleType, name: str) -> tuple[list, Any, dict[int, str]]:
    make_trace, fields, aborts = SCENARIOS[name]
    return make_trace(replay), replay.ReplayConfig(ext=True, **fields), aborts


def first_divergence(reference: list[Snapshot], other: list[Snapshot]) -> str | None:
    for step, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            return f"pass {step}: {fields} differ"
    if len(reference) != len(other):
        return f"{len(reference)} passes vs {len(other)}"
    return None


# ----- tensor parallel: same inputs, same decisions -----


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_tp_ranks_make_identical_decisions(replay: ModuleType, name: str) -> None:
    trace, config, aborts = scenario_config(replay, name)
    logs = lockstep(replay, [trace, trace], config, aborts)
    for rank, log in enumerate(logs[1:], start=1):
        assert first_divergence(logs[0], log) is None, f"rank {rank} diverged from rank 0"
    final = logs[0][-1]
    assert sorted(final["finished"]) == sorted({t.rid for t in trace} - set(_aborted(logs[0], trace)))
    # The scenarios exercise what a divergence would come from.
    assert final["runner"]["flights"] > 0
    assert any(len(snap["admitted"]) > 1 for snap in logs[0]), "some pass admits several requests"
    if "burst" in name or "shared-doc" in name:
        assert final["runner"]["deferrals"] > 0, "dedup deferred requests"
    if "evicting" in name:
        assert final["tree"][-1]["evicted_tokens"] > 0, "the pool was under eviction pressure"


def _aborted(log: list[Snapshot], trace: list) -> list[str]:
    """Requests that entered but neither finished nor are pending at the end: the aborted ones."""
    return [t.rid for t in trace if t.rid not in log[-1]["finished"]]


def test_divergence_is_detected(replay: ModuleType) -> None:
    """Control: ranks fed a trace differing in one request's last token are told apart."""
    trace, config, _ = scenario_config(replay, "burst-fcfs-aborts")
    last = trace[-1]
    changed = [*trace[:-1], replay.TraceReq(last.rid, (*last.tokens[:-1], last.tokens[-1] + 1))]
    logs = lockstep(replay, [trace, changed], config)
    assert first_divergence(logs[0], logs[1]) is not None


RANK_SCRIPT_SCENARIOS = ("burst-fcfs-aborts", "multi-turn-evicting-cost-lpm-aging")


def test_tp_ranks_in_separate_processes_with_different_hash_seeds(replay: ModuleType, tmp_path: Path) -> None:
    """As SGLang's rank processes: another interpreter, another PYTHONHASHSEED, other addresses."""
    procs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = tmp_path / f"rank-{seed}.json"
        cmd = [sys.executable, __file__, str(out), *RANK_SCRIPT_SCENARIOS]
        procs.append((out, subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)))
    local = {
        name: lockstep(replay, [scenario_config(replay, name)[0]], *scenario_config(replay, name)[1:])[0]
        for name in RANK_SCRIPT_SCENARIOS
    }
    for out, proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-4000:]
        remote = json.loads(out.read_text())
        for name in RANK_SCRIPT_SCENARIOS:
            assert first_divergence(local[name], remote[name]) is None, f"{out.name} {name}"


# ----- data parallel: independent trees -----


def test_dp_ranks_keep_independent_state(replay: ModuleType) -> None:
    """Two instances on different traces, interleaved, decide exactly what each decides alone."""
    config = replay.ReplayConfig(ext=True, chunked_prefill_size=1024, pool_tokens=2048)
    traces = [replay.burst(6, 1024, 64), replay.multi_turn(4, 4, 256, 300)]
    together = lockstep(replay, traces, config)
    alone = [lockstep(replay, [trace], config)[0] for trace in traces]
    for rank in range(2):
        assert first_divergence(alone[rank], together[rank]) is None, f"DP rank {rank} saw the other's state"
    # Not vacuous: the ranks' trees and queues really differ.
    assert together[0][-1]["tree"] != together[1][-1]["tree"]
    assert together[0][-1]["finished"] != together[1][-1]["finished"]


def main(out: str, *names: str) -> None:
    """One rank per scenario in this interpreter: `python test_rank_determinism.py OUT NAME...`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench, tests
    from tests.runner.conftest import load_replay

    replay = load_replay()
    logs = {}
    for name in names:
        trace, config, aborts = scenario_config(replay, name)
        logs[name] = lockstep(replay, [trace], config, aborts)[0]
    Path(out).write_text(json.dumps(logs))


if __name__ == "__main__":
    main(*sys.argv[1:])
