"""A lone long prompt's pass in layer slices (--prefill-ext-yield-layers) on the CPU replay: the real
scheduler forms the passes between slices (sliced request hidden, only shorts admitted) over real CPU
pools, the simulated clock of bench.replay.mixed_replay times the slices; KV accounting checked after
every pass, those between slices included. The forward itself is tests/runner/test_yield_layers.py's."""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

import pytest

from bench.lib.variants import VARIANTS
from sglang_prefill_ext.runner.pass_cost import PassCost
from tests.runner.conftest import lone_prompt, ported

COST = PassCost()
LAYERS = 32  # bench/models/llama3-8b-dummy
PER_SLICE = 4
GOODPUT = ("--prefill-ext-tbt-target-ms", "100")
SLICED = (*GOODPUT, "--prefill-ext-yield-layers", str(PER_SLICE))

pytestmark = ported("yield_layers", "tbt_target_ms")


def timed(mixed: ModuleType, replay: ModuleType, trace: list, extra: tuple[str, ...]) -> object:
    config = replay.ReplayConfig(
        ext=True, chunked_prefill_size=8192, pool_tokens=1 << 18, overlap=False, extra_args=extra
    )
    return mixed.run_timed(trace, config, COST, check_kv=True)


def slice_ms(mixed: ModuleType, tokens: int, context: int) -> float:
    return (COST.fixed_ms + COST.variable_ms(tokens, context)) * PER_SLICE / LAYERS + mixed.SLICE_GAP_MS


def test_shorts_arriving_mid_chunk_wait_one_slice_not_the_chunk(
    replay: ModuleType, mixed: ModuleType
) -> None:
    """The H200's worst mixed shorts: two arriving 22 and 40 ms into a 32K prompt's first 8K chunk.
    Unsliced they wait for the rest of the chunk; sliced, for the rest of the slice running when they
    come (the second also for the first's prefill and one more slice), then decode between the slices
    after: every token gap within 1.1 x the TBT target, and the pool's every slot has one owner after
    every pass, those between slices included."""
    trace = lone_prompt(mixed, replay, 32768, [22.0, 40.0])
    whole = timed(mixed, replay, trace, GOODPUT)
    sliced = timed(mixed, replay, trace, SLICED)
    assert whole.kv_errors == sliced.kv_errors == []
    chunk_ms = COST.fixed_ms + COST.variable_ms(8192, 0)
    one_slice = slice_ms(mixed, 8192, 0)
    short_pass = COST.fixed_ms + COST.variable_ms(1024, 0)
    for rid, arrival in (("s0", 22.0), ("s1", 40.0)):
        assert whole.ttft_ms[rid] > chunk_ms - arrival
        assert sliced.ttft_ms[rid] < 2 * (one_slice + short_pass)
    assert max(sliced.gaps()) <= 110.0
    assert sliced.ttft_ms["long"] > whole.ttft_ms["long"]  # the long prompt pays the passes between


def test_a_prompt_arriving_as_the_last_decode_finishes_is_still_alone(
    replay: ModuleType, mixed: ModuleType
) -> None:
    """A 32K prompt arrives the moment a short request's last token is out. SGLang keeps that finished
    request in its running batch (a pass with no prefill filters it), yet nobody decodes: the prompt
    gets the chunks it gets with no request before it (not TBT-sized ones), its chunks are sliced, and
    a short arriving 22 ms in waits one slice."""
    long, early, late = lone_prompt(mixed, replay, 32768, [0.0, 22.0])
    done_ms = timed(mixed, replay, [early], SLICED).e2e_ms["s0"]
    trace = [early, dataclasses.replace(long, ms=done_ms), dataclasses.replace(late, ms=done_ms + 22.0)]
    sliced = timed(mixed, replay, trace, SLICED)
    alone = timed(mixed, replay, [long, dataclasses.replace(late, ms=22.0)], SLICED)
    assert sliced.kv_errors == []
    assert sliced.chunks["long"] == alone.chunks["long"]
    one_slice = slice_ms(mixed, 8192, 0)
    short_pass = COST.fixed_ms + COST.variable_ms(1024, 0)
    assert sliced.ttft_ms["s1"] < 2 * (one_slice + short_pass)


@pytest.mark.parametrize("tokens", [8192, 32768])
def test_a_lone_prompt_keeps_its_chunks_and_pays_the_slice_gaps(
    replay: ModuleType, mixed: ModuleType, tokens: int
) -> None:
    """Alone, nothing runs between the slices: stock's chunks, each slower by its slices' gaps."""
    trace = lone_prompt(mixed, replay, tokens, [])
    whole = timed(mixed, replay, trace, GOODPUT)
    sliced = timed(mixed, replay, trace, SLICED)
    assert sliced.chunks == whole.chunks == {"long": tokens // 8192}
    gaps = tokens // 8192 * LAYERS // PER_SLICE * mixed.SLICE_GAP_MS
    assert sliced.ttft_ms["long"] == pytest.approx(whole.ttft_ms["long"] + gaps)
    assert sliced.kv_errors == []


def test_the_capacity_replay_runs_the_sliced_variant(replay: ModuleType) -> None:
    cr = importlib.import_module("bench.replay.capacity_replay")
    config = cr.replay_config(VARIANTS["ext_gp_yield"], 1 << 16)
    assert config.ext and not config.overlap
    assert config.extra_args == (*GOODPUT, "--prefill-ext-yield-layers", "4")
    assert "--disable-overlap-schedule" in config.server_argv()
