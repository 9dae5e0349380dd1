#!/usr/bin/env python3
"""Belady's optimum for a GPU run's pressure workloads, and each variant's place between LRU and it.

Reads what `bench/serving/ttft_bench.py run` wrote for each variant (`requests.jsonl`, `summary.json`; in
`run_ab.sh`'s `ab-results.tar.gz` they are `<variant>/...`). The bench sends random token ids and
records none of them; the pressure workload's structure is what matters and its generator fixes
it: every session draws its ids from its own seeded stream (sessions share no prefix), and turn
k+1's prompt is turn k's prompt + its output + new tool tokens. So each request is rebuilt as a
path on its session's chain: its prompt (`prompt_tokens`) plus the output KV the server keeps
(`output_tokens` - 1), in the order the requests were sent (the first variant's order; the first
variant should be stock). The pool is the server's `max_total_num_tokens` the workload recorded.

    python -m bench.replay.eviction_bound stock=out/stock ext=out/ext [--out-md eviction.md]

Per pressure workload: recomputed tokens (reusable prefix not served from cache, as the bench's
summary counts them) of each variant and of Belady's optimum (`sglang_prefill_ext.radix.belady`:
exact for one request at a time at token granularity, so a bound for a server), and each
variant's position between the first variant (0) and the optimum (1).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from sglang_prefill_ext.radix.belady import Access, Optimum, belady

SESSION_STRIDE = 1 << 40  # token ids of session s: s * SESSION_STRIDE + position


def load(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "requests.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return summary, records


def pressure_accesses(records: list[dict[str, Any]], workload: str) -> list[Access]:
    """The workload's requests as paths on per-session chains, in send order."""
    mine = sorted((r for r in records if r["workload"] == workload), key=lambda r: r["t_send"])
    failed = [r["idx"] for r in mine if r["error"] is not None]
    if failed:
        raise ValueError(
            f"{workload}: requests {failed} failed; their outputs (and so the next prompts) are unknown"
        )
    accesses = []
    for r in mine:
        kept = r["prompt_tokens"] + max(r["output_tokens"] - 1, 0)
        tokens = r["session"] * SESSION_STRIDE + np.arange(kept, dtype=np.int64)
        accesses.append(Access(tokens, r["prompt_tokens"]))
    return accesses


def rows(runs: list[tuple[str, dict[str, Any], list[dict[str, Any]]]]) -> list[str]:
    lines = [
        "| workload | pool tokens | sessions | variant | recomputed tokens | hit rate | LRU → Belady |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    _, first_summary, first_records = runs[0]
    for workload, ws in first_summary["workloads"].items():
        if not workload.startswith("pressure") or "pool_tokens" not in ws:
            continue
        pool = ws["pool_tokens"]
        optimum: Optimum = belady(pressure_accesses(first_records, workload), pool)
        if sum(optimum.reusable) != ws["reusable_tokens"]:
            raise ValueError(
                f"{workload}: rebuilt paths give {sum(optimum.reusable):,} reusable tokens, "
                f"the bench counted {ws['reusable_tokens']:,}"
            )
        measured = [(label, s["workloads"].get(workload, {})) for label, s, _ in runs]
        base = measured[0][1]["recomputed_tokens"]
        best = optimum.recomputed_tokens
        hit = 1 - optimum.computed_tokens / sum(optimum.prompt)
        for label, w in [
            *measured,
            ("Belady (offline optimum)", {"recomputed_tokens": best, "hit_rate": hit}),
        ]:
            recomputed = w.get("recomputed_tokens")
            if recomputed is None:
                lines.append(f"| {workload} | {pool:,} | {ws['sessions']} | {label} | - | - | - |")
                continue
            position = f"{(base - recomputed) / (base - best):.2f}" if base > best else "-"
            lines.append(
                f"| {workload} | {pool:,} | {ws['sessions']} | {label} | {recomputed:,} | "
                f"{w['hit_rate']:.3f} | {position} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="LABEL=DIR", help="ttft_bench output folders, stock first")
    parser.add_argument("--out-md")
    args = parser.parse_args(argv)
    runs = []
    for spec in args.runs:
        label, _, folder = spec.rpartition("=")
        summary, records = load(Path(folder))
        runs.append((label or summary.get("label", folder), summary, records))
    table = "\n".join(rows(runs))
    print(table)
    if args.out_md:
        Path(args.out_md).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
