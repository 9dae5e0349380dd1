"""Refit `--prefill-ext-pass-cost` (FIXED_MS,TOKEN_US,PAIR_PS) for a model and GPU from a stock run's
single-prompt TTFTs, or from the extension's pass log (`--prefill-ext-pass-log`).

    python -m bench.serving.fit_pass_cost OUT/ab/stock/requests.jsonl [--chunk 8192]
    python -m bench.serving.fit_pass_cost --pass-log OUT/ab/ext_gp/passes-main.jsonl

A prompt of n uncached tokens alone on stock runs one pass per chunk of `--chunk` tokens, so its TTFT is
the sum over its chunks of FIXED + TOKEN x tokens + PAIR x (new token, context token) pairs: linear in the
three constants (`PassCost`, the model the goodput and short-first budgets plan with). The fit takes the
requests of `bench/serving/ttft_bench.py`'s request log that ran alone with nothing cached (the baseline's
"<N> first" rows and the unique workload), minimises the relative error (a 1K prompt's 30 ms counts as
much as a 100K prompt's 6.6 s) with every constant >= 0, and prints the flag value and each length's
prediction against its measured median.

A pass log's chunks are timed and fitted as bench/lib/cost_fit.py says.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bench.lib.cost_fit import chunk_samples, fit_chunks, fit_relative, read_jsonl
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
    return fit_relative(x, np.array([t * 1e3 for _, t in samples]))


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


def chunk_report(samples: Sequence[tuple[int, int, float]], cost: PassCost) -> str:
    """The flag value and the fit's relative error over the timed chunks, beside the default model's."""

    def errors(model: PassCost) -> list[float]:
        return [abs(model.fixed_ms + model.variable_ms(n, ctx) - ms) / ms for n, ctx, ms in samples]

    fitted, default = errors(cost), errors(PassCost())
    return "\n".join(
        [
            f"--prefill-ext-pass-cost {cost}",
            f"(from {len(samples)} timed lone chunks of the pass log; the default is {PassCost()})",
            "| model | median relative error | p90 relative error |",
            "|---|---:|---:|",
            f"| fitted | {statistics.median(fitted):.3f} | {np.percentile(fitted, 90):.3f} |",
            f"| default | {statistics.median(default):.3f} | {np.percentile(default, 90):.3f} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "logs", type=Path, nargs="*", help="ttft_bench request logs (requests.jsonl) of stock"
    )
    parser.add_argument("--chunk", type=int, default=8192, help="the run's --chunked-prefill-size")
    parser.add_argument("--pass-log", type=Path, help="fit a --prefill-ext-pass-log file instead")
    args = parser.parse_args(argv)
    if args.pass_log is not None:
        try:
            samples = chunk_samples(read_jsonl(args.pass_log))
            cost = fit_chunks(samples)
        except (OSError, ValueError, KeyError) as err:
            print(f"fit_pass_cost: {err}", file=sys.stderr)
            return 1
        print(chunk_report(samples, cost))
        return 0
    if not args.logs:
        parser.error("give request logs or --pass-log")
    try:
        rows = [row for log in args.logs for row in read_jsonl(log)]
        samples = alone_samples(rows)
        cost = fit(samples, args.chunk)
    except (OSError, ValueError, KeyError) as err:
        print(f"fit_pass_cost: {err}", file=sys.stderr)
        return 1
    print(report(samples, cost, args.chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
