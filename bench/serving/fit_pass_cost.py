"""Refit `--prefill-ext-pass-cost` (FIXED_MS,TOKEN_US,PAIR_PS) for a model and GPU from a stock run's
single-prompt TTFTs.

    python -m bench.serving.fit_pass_cost OUT/ab/stock/requests.jsonl [--chunk 8192]

A prompt of n uncached tokens alone on stock runs one pass per chunk of `--chunk` tokens, so its TTFT is
the sum over its chunks of FIXED + TOKEN x tokens + PAIR x (new token, context token) pairs: linear in the
three constants (`PassCost`, the model the goodput and short-first budgets plan with). The fit takes the
requests of `bench/serving/ttft_bench.py`'s request log that ran alone with nothing cached (the baseline's
"<N> first" rows and the unique workload), minimises the relative error (a 1K prompt's 30 ms counts as
much as a 100K prompt's 6.6 s) with every constant >= 0, and prints the flag value and each length's
prediction against its measured median.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bench.lib.goodput import Targets
from sglang_prefill_ext.runner.pass_cost import PassCost

ALONE_WORKLOADS = ("baseline", "unique")


def features(tokens: int, chunk: int) -> tuple[float, float, float]:
    """(passes, new tokens, attention pairs) of `tokens` uncached tokens chunked by `chunk`, alone."""
    passes = pairs = 0.0
    for done in range(0, tokens, chunk):
        n = min(chunk, tokens - done)
        passes += 1
        pairs += n * done + n * n / 2
    return passes, float(tokens), pairs


def alone_samples(rows: Iterable[dict]) -> list[tuple[int, float]]:
    """(prompt tokens, TTFT s) of the requests that ran alone with nothing cached."""
    return [
        (row["prompt_tokens"], row["ttft_s"])
        for row in rows
        if row.get("error") is None
        and row.get("cached_tokens") == 0
        and row.get("ttft_s")
        and (
            row.get("workload") == "unique"
            or (row.get("workload") == "baseline" and str(row.get("group", "")).endswith(" first"))
        )
    ]


def fit(samples: Sequence[tuple[int, float]], chunk: int) -> PassCost:
    """The non-negative constants with the least squared relative error over `samples` (tokens, TTFT s)."""
    lengths = sorted({n for n, _ in samples})
    if len(lengths) < 3:
        raise ValueError(f"needs single-prompt TTFTs at 3 or more lengths, got {lengths}")
    x = np.array([features(n, chunk) for n, _ in samples])
    y = np.array([t * 1e3 for _, t in samples])
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


def predicted_s(cost: PassCost, tokens: int, chunk: int) -> float:
    """A lone uncached prompt's TTFT under `cost`: the goodput report's "alone on stock" model."""
    return Targets(alone_cost=cost, alone_chunk=chunk).alone_s(tokens, 0)


def report(samples: Sequence[tuple[int, float]], cost: PassCost, chunk: int) -> str:
    lines = [
        f"--prefill-ext-pass-cost {cost}",
        f"(from {len(samples)} single-prompt TTFTs, chunks of {chunk}; the default is {PassCost()})",
        "| prompt tokens | measured TTFT p50 (s) | fitted (s) | default model (s) |",
        "|---:|---:|---:|---:|",
    ]
    for n in sorted({n for n, _ in samples}):
        measured = statistics.median(t for m, t in samples if m == n)
        lines.append(
            f"| {n:,} | {measured:.3f} | {predicted_s(cost, n, chunk):.3f} | {predicted_s(PassCost(), n, chunk):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "logs", type=Path, nargs="+", help="ttft_bench request logs (requests.jsonl) of stock"
    )
    parser.add_argument("--chunk", type=int, default=8192, help="the run's --chunked-prefill-size")
    args = parser.parse_args(argv)
    try:
        rows = [
            json.loads(line) for log in args.logs for line in log.read_text().splitlines() if line.strip()
        ]
        samples = alone_samples(rows)
        cost = fit(samples, args.chunk)
    except (OSError, ValueError, KeyError) as err:
        print(f"fit_pass_cost: {err}", file=sys.stderr)
        return 1
    print(report(samples, cost, args.chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
