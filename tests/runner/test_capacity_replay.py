"""The capacity replay (bench.replay.capacity_replay) on SGLang's real scheduler: a variant's flags as the
replay's config, rag-stream's documents cached across requests, and the predicted capacities of stock
default and goodput scheduling on a small mixed sweep."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from bench.lib.goodput import Targets
from bench.lib.variants import VARIANTS
from sglang_prefill_ext.runner.pass_cost import PassCost
from tests.runner.conftest import ported


@pytest.fixture(scope="module")
def cr(replay: ModuleType) -> ModuleType:
    return importlib.import_module("bench.replay.capacity_replay")


def test_a_variants_flags_become_the_replays_config(cr: ModuleType) -> None:
    stock = cr.replay_config(VARIANTS["stock"], 1 << 16)
    assert (stock.ext, stock.chunked_prefill_size, stock.overlap, stock.extra_args) == (False, 8192, True, ())
    small = cr.replay_config(VARIANTS["stock_2048mc"], 1 << 16)
    assert (small.chunked_prefill_size, small.extra_args) == (2048, ("--enable-mixed-chunk",))
    ext = cr.replay_config(VARIANTS["ext_gp"], 1 << 16)
    assert ext.ext and ext.extra_args == ("--prefill-ext-tbt-target-ms", "100")
    assert not cr.replay_config("--disable-overlap-schedule", 1 << 16).overlap


def test_rag_stream_hits_find_their_document_cached(cr: ModuleType) -> None:
    shapes = cr.Shapes(rag_docs=4, doc_tokens=2048, rag_new_every=8, output=4)
    arrivals, rate = cr.rag_stream_arrivals(shapes, factor=0.5, per_point=24, seed=1)
    assert rate == pytest.approx(6.0)
    result = cr.mr.run_timed(arrivals, cr.replay_config("", 1 << 17), PassCost())
    groups = {a.req.rid: a.group for a in arrivals}
    colds = [rid for rid, g in groups.items() if g == "cold"]
    hits = [rid for rid, g in groups.items() if g == "hit"]
    assert len(hits) >= 24 and all(result.cached[rid] == 0 for rid in colds)
    # at 6 req/s a document's first request has long finished when the next one about it comes
    assert sum(result.cached[rid] == 2048 for rid in hits) >= len(hits) - 2


@ported("tbt_target_ms")
def test_goodput_scheduling_is_predicted_above_stock_default_on_mixed(cr: ModuleType) -> None:
    a = cr.build_parser().parse_args(
        ["--out-dir", "unused", "--per-point", "40", "--seeds", "1", "--factors", "1", "0.5", "0.25", "0.1"]
    )
    a.workloads = ["mixed"]
    cost = PassCost()
    targets = Targets(alone_cost=cost)
    caps = {
        name: cr.sweep_variant(name, VARIANTS[name], a, cost, targets)["workloads"]["mixed"]
        for name in ("stock", "ext_gp")
    }
    stock, ext = caps["stock"]["capacity"], caps["ext_gp"]["capacity"]
    assert ext["factor"] > stock["factor"] > 0
    # each sweep ran every factor down to its capacity's and one more below it, no further
    grid = [1.0, 0.5, 0.25, 0.1]
    for entry in caps.values():
        below = grid.index(entry["capacity"]["factor"]) + 1
        assert sorted({p["factor"] for p in entry["points"]}, reverse=True) == grid[: below + 1]
