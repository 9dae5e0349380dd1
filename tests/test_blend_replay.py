"""bench.replay.blend_replay: the passes and tokens it prices, on a plan small enough to count by hand."""

from __future__ import annotations

import pytest

from bench.lib.arrivals import RagChunksPlan
from bench.replay import blend_replay
from sglang_prefill_ext.runner.pass_cost import PassCost

PLAN = RagChunksPlan(lengths=(100, 200, 300), at_s=(0.0, 0.0), retrieved=((0, 1), (1, 0)))


def test_passes_are_counted_by_the_fixed_cost() -> None:
    first, second = blend_replay.replay(
        PLAN, PassCost(1.0, 0.0, 0.0), 0.15, system=10, question=5, chunk=8192
    )
    # the first question finds an empty store: one pass each way
    assert (first["stock"], first["k_passes"], first["one_pass"], first["hits"]) == (1.0, 1.0, 1.0, 0)
    # the second reorders the chunks: stock reuses the system prompt only; the blend reuses both chunks and
    # computes chunk 1's head [10, 40), chunk 0's head [210, 225) and the question [310, 315): three passes
    assert (second["stock"], second["k_passes"], second["one_pass"]) == (1.0, 3.0, 1.0)
    assert (second["hits"], second["recomputed"], second["reused"]) == (2, 30 + 15, 170 + 85)


def test_tokens_are_priced_once_whatever_the_passes() -> None:
    _, second = blend_replay.replay(PLAN, PassCost(0.0, 1000.0, 0.0), 0.15, system=10, question=5, chunk=8192)
    assert second["stock"] == pytest.approx(305.0)  # 1 ms a token
    assert second["k_passes"] == pytest.approx(50.0) == second["one_pass"]


def test_a_stream_of_runs_is_cut_into_chunked_passes() -> None:
    clock = PassCost(1.0, 0.0, 0.0)
    assert blend_replay.chunked_ms(clock, [(0, 5), (10, 15)], chunk=8) == 2.0
    assert blend_replay.chunked_ms(clock, [(0, 16)], chunk=8) == 2.0
    assert blend_replay.chunked_ms(clock, [(0, 17)], chunk=8) == 3.0


def test_the_summary_skips_the_warm_up() -> None:
    rows = blend_replay.replay(PLAN, PassCost(1.0, 0.0, 0.0), 0.15, system=10, question=5, chunk=8192)
    s = blend_replay.summary(rows, warm=1)
    assert (s["ratio_k"], s["ratio_one"], s["recomputed_share"]) == (pytest.approx(1 / 3), 1.0, 45 / 300)
