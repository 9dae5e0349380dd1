#!/usr/bin/env python3
"""Where a variant's TTFT goes: client records of bench/serving/ttft_bench.py split by SGLang's own
per-request times (servers started with `--enable-request-time-stats-logging`).

For each variant folder (`requests.jsonl` + `server-main.log`, as in run_ab.sh's results tarball)
and workload, the server's `ReqTimeStats` lines are paired with the client's records (same prompt
lengths, in arrival order), and each request's client TTFT is split into

- front: client send -> the scheduler's waiting queue (HTTP, tokenizer manager, IPC, and the wait
  for the scheduler's next loop iteration). Client and server clocks differ by an unknown constant:
  front is measured above the workload's fastest request, so it reads ~0 for an unloaded server;
- queue: waiting queue -> first forward (SGLang's `queue_duration`: the scheduling pass included);
- rest: first forward -> first token at the client (prefill, result processing, detokenizer,
  response).

    tar xzf ab-results.tar.gz -C ab && python -m bench.serving.stage_split ab --workload rag --hits
    python -m bench.serving.stage_split ab1 ab2 --hits --pool   # stock, stock_b, ... of both runs in one row
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.lib.stats import percentile

STATS = re.compile(
    r"ReqTimeStats\(rid=\S+, input_len=(\d+),.*queue_duration=([\d.]+)ms, forward_duration=[\d.]+ms, "
    r"entry_time=([\d.]+)"
)
PERCENTILES = (10, 50, 75, 90)


@dataclass(frozen=True)
class ServerStats:
    input_len: int
    queue_ms: float
    entry_s: float  # wall clock, seconds


@dataclass(frozen=True)
class Split:
    ttft_ms: float
    front_ms: float
    queue_ms: float
    rest_ms: float


def server_stats(log: Path) -> list[ServerStats]:
    """The server's finished requests in the order they entered its waiting queue."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        m = STATS.search(line)
        if m:
            found.append(ServerStats(int(m[1]), float(m[2]), float(m[3])))
    return sorted(found, key=lambda s: s.entry_s)


def pair(records: Sequence[dict], stats: Sequence[ServerStats]) -> list[tuple[dict, ServerStats]]:
    """`records` (one workload, by send time) with the window of `stats` holding the same prompt
    lengths; within a window, equal lengths pair in arrival order."""
    lengths = [r["server_prompt_tokens"] for r in records]
    n = len(lengths)
    for start in range(len(stats) - n + 1):
        window = stats[start : start + n]
        if sorted(s.input_len for s in window) == sorted(lengths):
            by_len: dict[int, list[ServerStats]] = {}
            for s in window:
                by_len.setdefault(s.input_len, []).append(s)
            return [(r, by_len[r["server_prompt_tokens"]].pop(0)) for r in records]
    raise ValueError(f"no run of {n} server requests with the client's prompt lengths")


def split(records: list[dict], log: Path) -> list[tuple[dict, Split]]:
    """Each of `records` (one workload) with its TTFT split by the server's times in `log`."""
    pairs = pair(sorted(records, key=lambda r: r["t_send"]), server_stats(log))
    offset = min(s.entry_s - r["t_send"] for r, s in pairs)
    out = []
    for r, s in pairs:
        ttft = 1e3 * r["ttft_s"]
        front = 1e3 * (s.entry_s - r["t_send"] - offset)
        out.append((r, Split(ttft, front, s.queue_ms, ttft - front - s.queue_ms)))
    return out


def report(roots: Sequence[Path], workload: str, hits: bool, pool: bool = False) -> str:
    """One table over every variant folder under `roots`; with `pool`, the requests of variants that
    share a name before "_" (stock, stock_b, ... of one or several runs) in one row per stage."""
    head = " | ".join(f"p{q}" for q in PERCENTILES)
    lines = [
        f"{workload}{' cache hits' if hits else ''} (ms; front above the workload's fastest request)",
        "",
        f"| variant | n | stage | {head} |",
        "| --- | ---: | --- |" + " ---: |" * len(PERCENTILES),
    ]
    rows: dict[str, list[Split]] = {}
    for root in roots:
        for folder in sorted(p for p in root.iterdir() if (p / "server-main.log").exists()):
            records = [
                json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines() if x.strip()
            ]
            ok = [r for r in records if r["workload"] == workload and r["error"] is None]
            if ok:
                name = folder.name.split("_")[0] if pool else folder.name
                rows.setdefault(name, []).extend(
                    s for r, s in split(ok, folder / "server-main.log") if not hits or r["cached_tokens"] > 0
                )
    for name, splits in sorted(rows.items()):
        for stage in ("ttft", "front", "queue", "rest"):
            values = [getattr(s, f"{stage}_ms") for s in splits]
            cells = " | ".join(f"{percentile(values, q):.1f}" for q in PERCENTILES)
            lines.append(f"| {name} | {len(values)} | {stage} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "roots",
        type=Path,
        nargs="+",
        help="folders holding one folder per variant (run_ab.sh's tarballs, unpacked)",
    )
    p.add_argument("--workload", default="rag")
    p.add_argument("--hits", action="store_true", help="only requests that hit the cache")
    p.add_argument(
        "--pool", action="store_true", help="one row per variant name before '_', over every server and root"
    )
    a = p.parse_args(argv)
    print(report(a.roots, a.workload, a.hits, a.pool))
    return 0


if __name__ == "__main__":
    sys.exit(main())
