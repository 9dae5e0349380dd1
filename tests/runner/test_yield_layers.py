"""A lone long prompt's pass in layer slices, a short request run between two slices, cache flushes
asked for while slices run (--prefill-ext-yield-layers), on real SGLang with a model forward:
`sglang.Engine` on the CPU (tests/runner/engine_driver.py: a tiny random Llama of 8 layers, the normal
event loop, the KV pools' strict busy and idle checks on), against the same engine stock and with the
extension but no slicing. Three engines, started side by side once for the module (~30 s each)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sglang_prefill_ext.patching import PatchSet
from tests.runner import engine_driver
from tests.runner.conftest import ported

CHUNK = 256
LONG = 2024  # eight chunks: seven of 256, then 232 (time for the short to arrive on a busy CPU)
FULL = LONG // CHUNK * CHUNK  # the tokens before its last chunk
SHORT = 40
ONE_CHUNK = 200  # a lone prompt of one chunk, sliced
YIELD = {"yield_layers": 3, "short_max_tokens": 64}  # slices of layers [0, 3), [3, 6), [6, 8)
ROUND_LONE, ROUND_SHORT = 0, 1
FLUSH_ROUNDS = list(range(2, 8))

pytestmark = ported("yield_layers")


def prompt(n: int, seed: int) -> list[int]:
    return [3 + (i * 7 + seed * 13) % 500 for i in range(n)]


# round 0: a long prompt alone; round 1: another long prompt, then a short one arriving behind its first chunk;
# FLUSH_ROUNDS: a one-chunk prompt alone each, the cache flushed over and over while it runs
ROUNDS = [[prompt(LONG, 1)], [prompt(LONG, 2), prompt(SHORT, 3)]] + [
    [prompt(ONE_CHUNK, seed)] for seed in range(4, 4 + len(FLUSH_ROUNDS))
]


def serve(tmp: Path, name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The driver's result for one engine (`options`: the extension's, None: stock)."""
    run = {
        "server": {"chunked_prefill_size": CHUNK},
        "rounds": ROUNDS,
        "max_new_tokens": 8,
        "flush_rounds": FLUSH_ROUNDS,
        # the short once the long prompt's first chunk ran, arriving while a slice of a later chunk runs
        "stagger": {"round": ROUND_SHORT, "after_passes": 1},
        "hold_slice": f"round{ROUND_SHORT}-0",
    }
    return engine_driver.serve(tmp, name, run, options)


@pytest.fixture(scope="module")
def served(patched_sglang: PatchSet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("yield")
    engine_driver.write_model(tmp / "model")
    variants = {"stock": None, "ext": {}, "sliced": YIELD}
    with ThreadPoolExecutor(max_workers=len(variants)) as pool:
        futures = {name: pool.submit(serve, tmp, name, options) for name, options in variants.items()}
        return {name: future.result() for name, future in futures.items()}


def test_a_sliced_lone_prompt_gives_the_whole_passes_output(served: dict[str, dict[str, Any]]) -> None:
    """Alone, each of its eight chunks runs in three slices (nothing to run between them): the same greedy
    tokens as stock's whole passes, and bit for bit the same logprobs."""
    stock, sliced = served["stock"], served["sliced"]
    assert sliced["outputs"][ROUND_LONE] == stock["outputs"][ROUND_LONE]
    assert sliced["logprobs"][ROUND_LONE] == stock["logprobs"][ROUND_LONE]


def test_a_short_arriving_behind_a_lone_chunk_runs_between_its_slices(
    served: dict[str, dict[str, Any]],
) -> None:
    """The short request, sent once the long prompt's first chunk ran, has its prefill as a pass formed
    between two slices of one of the long prompt's later chunks, so its first token comes sooner than
    without slicing; both outputs are stock's (the long prompt's KV untouched by the pass in between)."""
    stock, sliced = served["stock"], served["sliced"]
    assert sliced["outputs"][ROUND_SHORT] == stock["outputs"][ROUND_SHORT]
    # float32 rounding only: stock batches the two requests' passes differently (other matmul shapes)
    for ours, theirs in zip(sliced["logprobs"][ROUND_SHORT], stock["logprobs"][ROUND_SHORT], strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5)
    passes = sliced["pass_log"]
    short = [i for i, p in enumerate(passes) if p["reqs"] == [[SHORT, 0, 0]]]
    assert len(short) == 1 and passes[short[0]]["between_slices"]
    firsts = [i for i, p in enumerate(passes) if p["reqs"] == [[CHUNK, 0, 1]]]
    lasts = [i for i, p in enumerate(passes) if p["reqs"] == [[LONG - FULL, FULL, 0]]]
    assert len(firsts) == len(lasts) == 2  # one each per long prompt
    assert firsts[1] < short[0] < lasts[1]  # while the second long prompt's chunks ran
    assert short_ttft_ms(sliced) < short_ttft_ms(served["ext"])  # unsliced: behind the long prompt's chunks


def short_ttft_ms(result: dict[str, Any]) -> float:
    (ttft,) = [r["ttft_ms"] for r in result["log"] if r["input_len"] == SHORT]
    return ttft


def test_the_pools_stay_exact_with_a_short_interleaved(served: dict[str, dict[str, Any]]) -> None:
    """SGLang's strict pool checks ran every loop iteration and at idle (a leak or double free raises
    there and the scheduler dies): the engine still serves, and no request ended in an error."""
    sliced = served["sliced"]
    assert sliced["alive"] == served["stock"]["alive"]
    assert len(sliced["log"]) == 4 + len(FLUSH_ROUNDS) and all(r["error"] is None for r in sliced["log"])


def test_a_flush_asked_for_between_slices_waits_for_the_sliced_prompt(
    served: dict[str, dict[str, Any]],
) -> None:
    """A one-chunk prompt alone is sliced with nothing else in the scheduler: the flushes received
    between its slices find it in flight (SGLang's `last_batch`), not an idle scheduler, so none takes
    its KV slots or request slot from under it. Its outputs are stock's, the pools exact."""
    stock, sliced = served["stock"], served["sliced"]
    assert [sliced["outputs"][i] for i in FLUSH_ROUNDS] == [stock["outputs"][i] for i in FLUSH_ROUNDS]
    assert [sliced["logprobs"][i] for i in FLUSH_ROUNDS] == [stock["logprobs"][i] for i in FLUSH_ROUNDS]
    lone = [p for p in sliced["pass_log"] if p["reqs"] == [[ONE_CHUNK, 0, 0]]]
    assert len(lone) == len(FLUSH_ROUNDS)


def test_without_the_flag_the_extension_serves_stocks_outputs_unsliced(
    served: dict[str, dict[str, Any]],
) -> None:
    ext, stock = served["ext"], served["stock"]
    assert ext["outputs"] == stock["outputs"]
    assert ext["pass_log"] and not any(p["between_slices"] for p in ext["pass_log"])
