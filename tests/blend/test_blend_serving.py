"""Chunk blending served by real SGLang 0.5.17 with a model forward: `sglang.Engine` on the CPU
(tests/runner/engine_driver.py: a tiny random Llama of 8 layers, the normal event loop, the KV pools'
strict busy and idle checks on), requests with `chunk_spans` through its tokenizer manager. Six
engines, started side by side once for the module: stock, the extension without blending, and
`--prefill-ext-blend` at ratios 1 and 0.25 (the latter also under the overlap event loop, and with a
chunk budget below the prompt, which runs the plan's extends one pass each). A system prompt, 8 chunks
of 40 tokens, a question."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sglang_prefill_ext.doctor import report
from sglang_prefill_ext.doctor.log import read_log
from sglang_prefill_ext.patching import PatchSet
from sglang_prefill_ext.runner.pass_cost import PassCost
from tests.runner import engine_driver
from tests.runner.conftest import ported

pytestmark = ported("blend")

SYSTEM, QUESTION, CHUNK = 32, 24, 40
NAMES = "ABCDEFGH"
RATIO = 0.25
HEAD = math.ceil(RATIO * CHUNK)  # each reused chunk's recomputed head: 10 tokens


def prompt(order: str) -> tuple[list[int], list[list[int]]]:
    """The system prompt, the chunks in `order` (each its own token run), the question; its spans."""
    ids, spans = [3 + i for i in range(SYSTEM)], []
    for name in order:
        start = 40 + CHUNK * NAMES.index(name)
        spans.append([len(ids), len(ids) + CHUNK])
        ids += list(range(start, start + CHUNK))
    return ids + [400 + i for i in range(QUESTION)], spans


FIRST, FIRST_SPANS = prompt(NAMES)
SECOND, SECOND_SPANS = prompt("HCAGBFDE")
THIRD, THIRD_SPANS = prompt("DGAHCEBF")
MALFORMED = [[SYSTEM, SYSTEM + CHUNK], [SYSTEM + 10, SYSTEM + 20]]  # the second starts inside the first

# stock and the extension without --prefill-ext-blend: each prompt without and with its spans, then
# with malformed ones (dropped, as stock drops an unknown field)
OFF_ROUNDS = [[FIRST], [FIRST], [SECOND], [SECOND], [SECOND]]
OFF_SPANS = [None, [FIRST_SPANS], None, [SECOND_SPANS], [MALFORMED]]
# blended: the chunks stored in one order, reused in another; a third order aborted once its one pass
# is formed, then served whole; malformed spans; the second and third orders at once
BLEND_ROUNDS = [[FIRST], [SECOND], [THIRD], [THIRD], [SECOND], [SECOND, THIRD]]
BLEND_SPANS = [
    [FIRST_SPANS],
    [SECOND_SPANS],
    [THIRD_SPANS],
    [THIRD_SPANS],
    [MALFORMED],
    [SECOND_SPANS, THIRD_SPANS],
]
STORED, REUSED, ABORTED, AGAIN, REFUSED, BOTH = range(6)
# a high static fraction: engines loading side by side take memory between its two readings
SERVER = {"chunked_prefill_size": 512, "mem_fraction_static": 0.3}
# below a reordered prompt's 344 tokens past the match (its reused ones counted), above its 104 computed
BLEND_SERVER = {**SERVER, "chunked_prefill_size": 256}
BLEND = {"blend": True, "blend_recompute_ratio": RATIO, "log_fingerprints": True, "fingerprint_block": 32}
ABORT = {"round": ABORTED, "after_passes": 1}
# name: (the extension's options, None: stock; rounds; their spans; the abort; server keywords)
ENGINES = {
    "stock": (None, OFF_ROUNDS, OFF_SPANS, None, SERVER),
    "off": ({}, OFF_ROUNDS, OFF_SPANS, None, SERVER),
    "ratio1": (
        {"blend": True, "blend_recompute_ratio": 1.0},
        BLEND_ROUNDS[:2],
        BLEND_SPANS[:2],
        None,
        SERVER,
    ),
    "blend": (BLEND, BLEND_ROUNDS, BLEND_SPANS, ABORT, BLEND_SERVER),
    # SGLang's overlap event loop: the next pass formed while the last one runs
    "overlap": (BLEND, BLEND_ROUNDS, BLEND_SPANS, ABORT, {**BLEND_SERVER, "disable_overlap_schedule": False}),
    # a chunk budget below the reordered prompt: SGLang chunks it, so it runs one pass per computed run
    "passes": (BLEND, BLEND_ROUNDS[:2], BLEND_SPANS[:2], None, {**SERVER, "chunked_prefill_size": 64}),
}


@pytest.fixture(scope="module")
def served(patched_sglang: PatchSet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("blend")
    engine_driver.write_model(tmp / "model")

    def serve(name: str) -> dict[str, Any]:
        options, rounds, spans, abort, server = ENGINES[name]
        run = {"server": server, "rounds": rounds, "spans": spans, "max_new_tokens": 8}
        if abort is not None:
            run["abort"] = abort
        return engine_driver.serve(tmp, name, run, options)

    with ThreadPoolExecutor(max_workers=len(ENGINES)) as pool:
        return dict(zip(ENGINES, pool.map(serve, ENGINES), strict=True))


def lines(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {line["rid"]: line for line in result["log"]}


def test_flag_off_chunk_spans_change_no_token(served: dict[str, dict[str, Any]]) -> None:
    """Stock, and the extension without --prefill-ext-blend: valid or malformed spans, the same greedy
    ids as the same prompt without them (the logprobs up to float32 rounding: the repeat is a cache
    hit), and the same ids and logprobs as each other."""
    for name in ("stock", "off"):
        outputs, logprobs = served[name]["outputs"], served[name]["logprobs"]
        assert outputs[0] == outputs[1] and outputs[2] == outputs[3] == outputs[4]
        for a, b in ((0, 1), (2, 3), (2, 4)):
            assert logprobs[b][0] == pytest.approx(logprobs[a][0], rel=1e-4, abs=1e-5)
        assert served[name]["errors"] == [None] * len(OFF_ROUNDS)
    assert served["off"]["outputs"] == served["stock"]["outputs"]
    for ours, theirs in zip(served["off"]["logprobs"], served["stock"]["logprobs"], strict=True):
        assert ours[0] == pytest.approx(theirs[0], rel=1e-5, abs=1e-6)
    assert all(line["blend"] is None for line in served["off"]["log"])


def test_ratio_one_is_the_full_prefill(served: dict[str, dict[str, Any]]) -> None:
    """Every chunk token recomputed: the reordered prompt's greedy ids and logprobs are the full
    prefill's (the extension's without blending, after the same first prompt)."""
    ratio1, off = served["ratio1"], served["off"]
    assert ratio1["outputs"][REUSED] == off["outputs"][2]
    assert ratio1["logprobs"][REUSED][0] == pytest.approx(off["logprobs"][2][0], rel=1e-5, abs=1e-6)
    counts = lines(ratio1)[f"round{REUSED}-0"]["blend"]
    assert counts == {"chunk_tokens": 8 * CHUNK, "hits": 0, "reused_tokens": 0, "recomputed_tokens": 0}


def test_a_reordered_set_reuses_the_store_and_recomputes_the_ratio_s_heads_in_one_pass(
    served: dict[str, dict[str, Any]],
) -> None:
    """The first prompt stores its 8 chunks; the reordered one matches the system prompt in the tree,
    reuses all 8 from the store and computes each chunk's head (ceil(0.25 * 40) = 10 tokens) and the
    question, all in one forward pass: one extend of its whole prompt past the match, as scheduled,
    though that extend (344) exceeds the chunk budget (256): the budget is charged its 104 computed
    tokens. The stored prompt, reusing nothing, is chunked by it."""
    blend = served["blend"]
    log = lines(blend)
    stored, reused = log[f"round{STORED}-0"], log[f"round{REUSED}-0"]
    assert stored["chunks"] == 2
    assert stored["blend"] == {
        "chunk_tokens": 8 * CHUNK,
        "hits": 0,
        "reused_tokens": 0,
        "recomputed_tokens": 0,
    }
    # SGLang's own count of cached tokens: the tree's match and the placed chunks
    assert reused["cached_tokens"] == SYSTEM + 8 * (CHUNK - HEAD)
    assert reused["chunks"] == 1
    assert reused["blend"] == {
        "chunk_tokens": 8 * CHUNK,
        "hits": 8,
        "reused_tokens": 8 * (CHUNK - HEAD),
        "recomputed_tokens": 8 * HEAD,
    }
    # the passes as scheduled ([new tokens, cached tokens, continues]): the stored prompt's two, the
    # reordered one's
    extends = [p["reqs"] for p in blend["pass_log"] if p["reqs"]]
    budget = BLEND_SERVER["chunked_prefill_size"]
    assert extends[:3] == [
        [[budget, 0, 1]],
        [[len(FIRST) - budget, budget, 0]],
        [[len(SECOND) - SYSTEM, SYSTEM, 0]],
    ]
    assert blend["finish"][REUSED] == ["length"]


def test_one_pass_gives_the_plan_s_extends_run_one_pass_each(served: dict[str, dict[str, Any]]) -> None:
    """With a chunk budget (64) below the reordered prompt, SGLang chunks it, and it runs its plan's
    extends one pass each: a head after each chunk's start, then the question. The one pass gives
    the same greedy ids and logprobs (float32 rounding: its rows are computed in other batches),
    reused and recomputed counts."""
    blend, passes = served["blend"], served["passes"]
    reused = lines(passes)[f"round{REUSED}-0"]
    assert reused["chunks"] == 9
    assert reused["blend"] == lines(blend)[f"round{REUSED}-0"]["blend"]
    extends = [p["reqs"] for p in passes["pass_log"] if p["reqs"]]
    heads = [[[HEAD, start, 1]] for start, _ in SECOND_SPANS]
    first = extends.index(heads[0])  # after the stored prompt's chunks
    assert extends[first : first + 9] == [*heads, [[QUESTION, len(SECOND) - QUESTION, 0]]]
    assert passes["outputs"][REUSED] == blend["outputs"][REUSED]
    assert passes["logprobs"][REUSED][0] == pytest.approx(blend["logprobs"][REUSED][0], rel=1e-5, abs=1e-5)


def test_an_abort_of_a_blended_request_leaks_nothing(served: dict[str, dict[str, Any]]) -> None:
    """A third order, aborted once its one pass is formed (its reused chunks placed in its slots): its
    line says so. SGLang's strict pool checks ran every loop iteration and at idle (a leak or a double
    free kills the scheduler): the engine still serves, and the same prompt then runs whole over the
    intact store. Its first chunk's head is in the tree (the aborted request's exact tokens): it
    computes the token after it, reuses that chunk's rest, and the other seven as before."""
    blend = served["blend"]
    aborted, again = (lines(blend)[f"round{i}-0"] for i in (ABORTED, AGAIN))
    assert aborted["error"] is not None and aborted["chunks"] == 1
    assert blend["finish"][ABORTED] == ["abort"]
    assert again["error"] is None and again["chunks"] == 1
    assert again["cached_tokens"] >= SYSTEM + HEAD
    assert again["blend"] == {
        "chunk_tokens": 8 * CHUNK - HEAD,
        "hits": 8,
        "reused_tokens": 8 * (CHUNK - HEAD) - 1,
        "recomputed_tokens": 7 * HEAD + 1,
    }
    assert blend["alive"] == served["stock"]["alive"]


def test_malformed_spans_are_stock_s_400_kind_of_error(served: dict[str, dict[str, Any]]) -> None:
    """Under --prefill-ext-blend malformed spans are the ValueError the HTTP server answers with a 400
    (tests/adapters/test_chunk_spans_request.py: through `/generate`), with `parse_chunk_spans`'s message."""
    error = served["blend"]["errors"][REFUSED]
    assert error == (
        f"chunk_spans[1] = [{SYSTEM + 10}, {SYSTEM + 20}] starts before chunk_spans[0] ends "
        f"({SYSTEM + CHUNK}); spans must be in order and must not overlap."
    )


def test_the_doctor_reports_what_blending_recovered(
    served: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The blended engine's own request log (with fingerprints) through the doctor: its finished
    blended requests' chunk tokens, those reused from the store beside those recomputed, and the prefix
    cache's hits without the reused chunks (the aborted request left out)."""
    log_lines = served["blend"]["log"]
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in log_lines))
    result = report.build([read_log(log)], PassCost())
    finished = [line for line in log_lines if line["error"] is None]
    blended = [line["blend"] for line in finished if line["blend"] is not None]
    # stored (no hit), reused, the third order after the abort, the batch's two (8 hits each)
    assert len(blended) == 5
    reused, recomputed, chunk = (
        sum(b[key] for b in blended) for key in ("reused_tokens", "recomputed_tokens", "chunk_tokens")
    )
    assert result["blend"] == {
        "requests": 5,
        "hits": 8 * 4,
        "chunk_tokens": chunk,
        "reused_tokens": reused,
        "recomputed_tokens": recomputed,
        "computed_tokens": chunk - reused - recomputed,
    }
    tree_hits = [line["cached_tokens"] - (line["blend"] or {}).get("reused_tokens", 0) for line in finished]
    assert result["cached_tokens"] == sum(tree_hits)
    assert f"{reused:,} reused from the chunk store (32 chunks)" in report.text(result)


def test_the_overlap_loop_serves_the_same(served: dict[str, dict[str, Any]]) -> None:
    """Under SGLang's overlap event loop (its default): the same greedy ids, passes and counts. On the
    CPU this checks the order of the steps only: on a GPU the one pass places its reused chunks on the
    forward stream, before the forward, and the fallback's placements between passes run on the
    scheduler's stream, which `run_batch` makes the forward stream wait for (not yet run there)."""
    blend, overlap = served["blend"], served["overlap"]
    done = [i for i, finish in enumerate(blend["finish"]) if finish == ["length"]]
    assert [overlap["outputs"][i] for i in done] == [blend["outputs"][i] for i in done]
    # the stored (two), reused, aborted and again rounds' passes (the abort lands as it may)
    assert [p["reqs"] for p in overlap["pass_log"] if p["reqs"]][:5] == [
        p["reqs"] for p in blend["pass_log"] if p["reqs"]
    ][:5]
    for rid in (f"round{STORED}-0", f"round{REUSED}-0"):
        assert lines(overlap)[rid]["blend"] == lines(blend)[rid]["blend"]
    assert lines(overlap)[f"round{ABORTED}-0"]["error"] is not None
    assert overlap["alive"] == served["stock"]["alive"]


def test_two_blended_requests_share_one_pass(served: dict[str, dict[str, Any]]) -> None:
    """Two reordered prompts in one batch, each extend (334 tokens) above the budget (256) but each
    charged its computed tokens only: both admitted whole, both run in the same one pass, each reusing
    all 8 chunks, and end without error."""
    blend = served["blend"]
    first, second = (lines(blend)[f"round{BOTH}-{i}"] for i in range(2))
    assert first["blend"]["hits"] == second["blend"]["hits"] == 8
    assert first["chunks"] == second["chunks"] == 1
    assert first["error"] is None and second["error"] is None
    # each from its match on: the system prompt and its first chunk's head, the third order's with the
    # token after it (the tree took them from its earlier runs)
    head, again = SYSTEM + HEAD, SYSTEM + HEAD + 1
    assert [p["reqs"] for p in blend["pass_log"] if len(p["reqs"]) == 2] == [
        [[len(SECOND) - head, head, 0], [len(THIRD) - again, again, 0]]
    ]
    assert blend["finish"][BOTH] == ["length", "length"]
