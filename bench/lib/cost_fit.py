"""Fitting the pass-cost model (`PassCost`) to measured times: the non-negative least squares of the
relative error, and the timed chunks of a pass log (`--prefill-ext-pass-log`).

A pass log times each pass itself: while the overlap loop runs a long prompt's chunks back to back, the
gap between the formings of the next two passes is a chunk's forward time (`PassRecord`). A stock run's
lone prompts all use one chunk size, so their TTFTs barely tell the fixed cost from the per-token one;
the goodput policy's chunks of every size after every context do (the H200 log of 2026-12-03,
bench/baselines/h200-passes-2026-12-03.jsonl: ~11 ms a pass, not the TTFT fit's 5).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sglang_prefill_ext.runner.pass_cost import PassCost

H200_PASS_LOG = Path(__file__).resolve().parents[1] / "baselines" / "h200-passes-2026-12-03.jsonl"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def chunk_samples(rows: Sequence[dict]) -> list[tuple[int, int, float]]:
    """(new tokens, context, forward ms) of each lone chunk of a pass log whose time the log shows: its
    prompt's next two chunks follow it, each the pass's only request, nothing riding, all overlapped
    (a pass formed after the last one's result, `synced`, starts a scheduling gap late)."""
    out = []
    for a, b, c in zip(rows, rows[1:], rows[2:], strict=False):
        if c["index"] - a["index"] != 2 or any(len(r["reqs"]) != 1 or r.get("riding", 0) for r in (a, b, c)):
            continue
        if b.get("synced") or c.get("synced"):
            continue
        (na, ca, more_a), (nb, cb, more_b), (_, cc, _) = a["reqs"][0], b["reqs"][0], c["reqs"][0]
        if more_a and more_b and cb == ca + na and cc == cb + nb:
            out.append((na, ca, c["t_ms"] - b["t_ms"]))
    return out


def fit_chunks(samples: Sequence[tuple[int, int, float]]) -> PassCost:
    """The constants with the least squared relative error over `samples` (tokens, context, ms)."""
    if len({(n, ctx) for n, ctx, _ in samples}) < 3:
        raise ValueError(f"needs 3 or more distinct timed chunks, got {len(samples)} chunks")
    x = np.array([(1.0, n, n * ctx + n * n / 2) for n, ctx, _ in samples])
    return fit_relative(x, np.array([ms for _, _, ms in samples]))


def fit_pass_log(path: Path) -> PassCost:
    """`fit_chunks` over a `--prefill-ext-pass-log` file."""
    return fit_chunks(chunk_samples(read_jsonl(path)))


def fit_relative(x: np.ndarray, y: np.ndarray) -> PassCost:
    """Non-negative (fixed ms, ms per token, ms per pair) minimising the squared relative error of
    `x @ coef` (columns: passes, tokens, pairs) against `y` (ms)."""
    x, target = x / y[:, None], np.ones_like(y)  # relative error
    scale = np.array([1.0, 1e-3, 1e-9])  # ms per pass, us per token, ps per pair
    best: tuple[float, np.ndarray] | None = None
    for keep in itertools.product([True, False], repeat=3):  # non-negative least squares over 3 unknowns
        cols = [i for i in range(3) if keep[i]]
        if not cols:
            continue
        coef = np.zeros(3)
        coef[cols] = np.linalg.lstsq(x[:, cols], target, rcond=None)[0]
        if (coef < 0).any():
            continue
        err = float(((x @ coef - target) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, coef)
    assert best is not None  # the passes column alone always fits with a positive constant
    fixed_ms, token_us, pair_ps = (best[1] / scale).tolist()
    return PassCost(round(fixed_ms, 3), round(token_us, 3), round(pair_ps, 1))
