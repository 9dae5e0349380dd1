"""Chunk plans: ends aligned to pages and to waiting requests' divergence points, the decode-adaptive
budget; the rules alone, then on the real scheduler through the replay (0.5.17: 0.5.23 keeps SGLang's
chunk ends and refuses these flags)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from sglang_prefill_ext.runner import Position
from sglang_prefill_ext.runner.chunking import aligned_chunk_end, decode_adaptive_budget, divergence_points
from tests.runner.conftest import ported
from tests.runner.test_scheduler_replay import run


def test_chunk_end_pulls_back_to_a_divergence_in_the_last_part_only() -> None:
    assert aligned_chunk_end(0, 2048, 1, [1900], 0.25) == 1900
    assert aligned_chunk_end(0, 2048, 1, [1000, 3000], 0.25) == 2048  # outside the chunk's last quarter
    assert aligned_chunk_end(0, 2048, 1, [1600, 1900], 0.25) == 1900  # the latest one
    assert aligned_chunk_end(0, 2048, 1, [1900], 0.0) == 2048
    assert aligned_chunk_end(256, 2300, 16, [2200], 0.25) == 2192  # page-aligned down
    assert aligned_chunk_end(256, 2300, 16, [], 0.25) == 2288
    assert aligned_chunk_end(256, 270, 16, [], 0.25) == 270  # less than a page: SGLang's end stands


def test_divergence_points_only_for_requests_on_our_matched_path() -> None:
    ours = np.arange(100, dtype=np.int64)
    theirs = np.concatenate([ours[:70], np.full(30, -1, dtype=np.int64)])
    position = Position(None, "n1", ours, 40)
    others = [
        Position(None, "root", theirs, 0),
        Position(None, "n1", theirs, 40),
        Position(None, "elsewhere", theirs, 40),
        Position("lora", "n1", theirs, 40),
        Position(None, "n1", theirs[:60], 40),
    ]
    assert list(divergence_points(position, 90, others, {"root", "n1"})) == [70, 70, 60]


@pytest.mark.parametrize(("decoding", "budget"), [(0, 8192), (8, 8192), (16, 4096), (64, 1024), (1000, 1024)])
def test_decode_adaptive_budget_shrinks_with_the_decode_batch(decoding: int, budget: int) -> None:
    assert decode_adaptive_budget(8192, decoding, 8, 1024, 16) == budget
    assert decode_adaptive_budget(8192, decoding, 0, 1024, 16) == 8192  # off


def _shared_then_own(replay: ModuleType, shared: int, own: int) -> list:
    rng = replay.random.Random(11)
    prefix = replay._tokens(rng, shared)
    return [replay.TraceReq(f"p{i}", tuple(prefix + replay._tokens(rng, own))) for i in range(2)]


@ported("chunk_align_tail")
@pytest.mark.parametrize(("tail", "first_chunk"), [("0.25", 1900), ("0", 2048)])
def test_a_chunk_ends_where_a_waiting_prompt_diverges(
    replay: ModuleType, tail: str, first_chunk: int
) -> None:
    """p0 and p1 share 1,900 tokens; p0 is chunked at 2,048, p1 waits for p0's chunk to land in the tree.
    Aligned, the landed chunk is exactly the node p1 matches: no node is split."""
    trace = _shared_then_own(replay, 1900, 600)
    ext = run(
        replay,
        trace,
        ext=True,
        chunked_prefill_size=2048,
        extra_args=("--prefill-ext-chunk-align-tail", tail),
    )
    admitted = [a for step in ext.steps for a in step.admitted]
    assert admitted[0] == ("p0", 0, first_chunk)
    assert ("p1", 1900, 2500) in admitted  # matched the landed chunk, computed only its own tokens
    assert ext.prefill_tokens == replay.ideal_prefill_tokens(trace)
    splits = ext.scheduler.tree_cache.tree.counters.splits
    assert (splits == 0) is (first_chunk == 1900)


@ported("decode_adaptive_budget")
def test_decode_adaptive_budget_on_the_scheduler(replay: ModuleType) -> None:
    """16 requests decoding, reference 4: the long prompt's chunks shrink to 8192 x 4 / 16 = 2048."""
    # 16 short requests prefill at the first step and then decode; the long prompt comes next.
    trace = [replay.TraceReq(f"d{i}", (5, 6, 7, i), max_new_tokens=64) for i in range(16)]
    trace.append(replay.TraceReq("long", tuple(range(1000, 7000)), arrival=1))
    chunks = {}
    for extra in ((), ("--prefill-ext-decode-adaptive-budget", "4")):
        scheduler = replay.ReplayScheduler(
            replay.ReplayConfig(ext=True, chunked_prefill_size=8192, pool_tokens=1 << 16, extra_args=extra)
        )
        for _ in replay.drive(scheduler, trace):
            assert scheduler.kv_accounting_errors() == []
        assert sorted(scheduler.finished) == sorted(t.rid for t in trace)
        chunks[extra] = [
            end - start for step in scheduler.steps for rid, start, end in step.admitted if rid == "long"
        ]
    assert chunks[()] == [6000]
    assert chunks[("--prefill-ext-decode-adaptive-budget", "4")] == [2048, 2048, 1904]
