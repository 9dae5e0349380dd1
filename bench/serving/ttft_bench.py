#!/usr/bin/env python3
"""TTFT benchmark client for a running SGLang server (POST /generate with `input_ids`, streamed).

Sub-commands:

  run      send one or more workloads to a server; append one JSON line per request to
           OUT_DIR/requests.jsonl and merge per-workload statistics into OUT_DIR/summary.json
  report   read one or more summaries (e.g. stock and ext) and write a markdown table with
           stock/ext ratios and a goodput table of every variant, plus CDF PNGs (TTFT; short
           requests' TTFT and time between tokens) when matplotlib is importable

Every request's streamed tokens are timed: TTFT, the gaps between tokens (TBT) and goodput, the
requests per second meeting both a TTFT and a TBT target (`bench/lib/goodput.py`; the targets are
the `goodput targets` flags).
  list     print the workloads and what they send

No tokenizer is needed: prompts are seeded random token ids in [--token-low, --token-high),
which by default stays below Llama-3's special tokens (128000..128255). Identical `--seed` gives
identical prompts, so a stock and an ext server see the same requests.

Needs only the standard library and aiohttp (matplotlib and tqdm are optional).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.lib.arrivals import QUESTION_TOKENS, add_rag_chunks_args
from bench.lib.client import Client, flush_cache, server_info, wait_healthy
from bench.lib.goodput import Targets
from bench.serving.report import fmt, load_summary, report, summarize_workload
from bench.serving.workloads import (
    DEFAULT_WORKLOADS,
    ESTIMATED_S,
    WORKLOADS,
    Ctx,
    TokenSource,
    pressure_names,
    workload_kind,
)
from sglang_prefill_ext.runner.pass_cost import PassCost

LLAMA3_FIRST_SPECIAL = 128000


async def run_workloads(a: argparse.Namespace) -> int:
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / "requests.jsonl"
    summary_path = out_dir / "summary.json"
    url = a.url.rstrip("/")
    if not wait_healthy(url, a.health_timeout):
        print(f"server at {url} is not healthy after {a.health_timeout:.0f} s", file=sys.stderr)
        return 2
    info = server_info(url)
    summary = load_summary(summary_path)
    summary.setdefault("label", a.label)
    summary.setdefault("workloads", {})
    summary.setdefault("servers", {})
    names = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for w in names:
        if w not in WORKLOADS:
            print(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
            return 2
    names = [n for w in names for n in (pressure_names(a.pressure_ratio) if w == "pressure" else [w])]
    tokens = TokenSource(a.seed, a.token_low, a.token_high)
    targets = targets_of(a)
    summary["targets"] = targets.as_dict()
    rc = 0
    async with Client(url, a.label, jsonl, progress=not a.no_progress) as client:
        if a.warmup:
            t0 = time.perf_counter()
            await client.generate(
                tokens.ids(512, "warmup"), workload="warmup", group="warmup", idx=0, t0=t0, max_new_tokens=4
            )
            client.records.clear()
        for w in names:
            estimate = ESTIMATED_S[workload_kind(w)] * (a.baseline_reps if w == "baseline" else 1)
            if a.deadline and time.time() + estimate > a.deadline:
                print(f"[{a.label}] {w}: skipped, would pass the deadline", flush=True)
                summary["workloads"][w] = {"skipped": "deadline"}
                continue
            if not a.no_flush and not flush_cache(url):
                print(
                    f"[{a.label}] {w}: /flush_cache failed; prompts are fresh random ids anyway", flush=True
                )
            client.records.clear()
            ctx = Ctx(client, tokens, a, info.get("max_total_num_tokens"))
            t0 = time.perf_counter()
            try:
                extra = await WORKLOADS[workload_kind(w)](ctx, w)
            except Exception as e:  # keep the other workloads running
                extra = {"failed": f"{type(e).__name__}: {e}"}
                rc = 1
            wall = time.perf_counter() - t0
            ws = summarize_workload(client.records, wall, extra, targets)
            summary["workloads"][w] = ws
            summary["servers"][w] = info
            with open(summary_path, "w") as f:
                json.dump(summary, f, indent=1)
            t = ws["ttft_s"]
            print(
                f"[{a.label}] {w}: n={ws['n']} err={ws['errors']} wall={wall:.1f}s "
                f"ttft p50={fmt(t['p50'])} p99={fmt(t['p99'])} hit={fmt(ws['hit_rate'], 3)} "
                f"prefill={fmt(ws['prefill_tok_s'], 0)} tok/s tbt p99={fmt(ws['tbt_s']['p99'])} "
                f"goodput={fmt(ws['goodput_req_s'], 2)} req/s ({fmt(ws['slo_attainment'], 2)} met)",
                flush=True,
            )
            if ws["errors"]:
                print(f"  errors: {ws['error_samples']}", flush=True)
                rc = 1
    return rc


def targets_of(a: argparse.Namespace) -> Targets:
    return Targets(
        short_max_tokens=a.short_max_tokens,
        short_ttft_target_ms=a.short_ttft_target_ms,
        long_factor=a.long_ttft_factor,
        tbt_target_ms=a.tbt_target_ms,
        alone_cost=PassCost.parse(a.alone_cost),
        alone_chunk=a.alone_chunk,
    )


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def add_client_args(p: argparse.ArgumentParser, workloads: Sequence[str]) -> None:
    """The server, the label, the workloads (default `workloads`), the output folder and the prompts."""
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--label", default="stock", help="variant name stored with every record (stock, ext, ...)")
    p.add_argument(
        "--workloads", default=",".join(workloads), help=f"comma-separated, from: {', '.join(WORKLOADS)}"
    )
    p.add_argument("--out-dir", required=True)
    p.add_argument("--seed", type=int, default=20261129)
    p.add_argument("--token-low", type=int, default=1000)
    p.add_argument(
        "--token-high",
        type=int,
        default=LLAMA3_FIRST_SPECIAL,
        help="exclusive; keep below the first special id and the vocab size (Llama-3: 128000)",
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="all workloads but baseline (1)")
    p.add_argument("--health-timeout", type=float, default=600.0)
    p.add_argument("--no-progress", action="store_true")


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The workloads' shapes (`run` here, `bench.serving.capacity run`)."""
    g = p.add_argument_group("workload shapes (defaults follow issue 4)")
    g.add_argument("--baseline-reps", type=int, default=3)
    g.add_argument("--burst-n", type=int, default=16)
    g.add_argument("--burst-shared", type=int, default=32768)
    g.add_argument("--burst-own", type=int, default=512)
    g.add_argument("--burst-reps", type=int, default=3)
    g.add_argument("--rag-docs", type=int, default=4)
    g.add_argument("--rag-doc-tokens", type=int, default=16384)
    g.add_argument("--rag-requests", type=int, default=64)
    g.add_argument("--rag-question-tokens", type=int, default=QUESTION_TOKENS)
    g.add_argument("--rag-rate", type=float, default=8.0, help="Poisson arrivals per second")
    g.add_argument("--agent-sessions", type=int, default=8)
    g.add_argument("--agent-turns", type=int, default=6)
    g.add_argument("--agent-system-tokens", type=int, default=2048, help="shared by all sessions")
    g.add_argument("--agent-first-tokens", type=int, default=8192, help="turn-1 prompt, system included")
    g.add_argument("--agent-tool-tokens", type=int, default=8000, help="appended after each reply")
    g.add_argument("--agent-think-s", type=float, default=0.0)
    g.add_argument(
        "--agent-session-rate", type=float, default=0.0, help="sessions started per second (0: all at once)"
    )
    g.add_argument("--rag-stream-requests", type=int, default=200)
    g.add_argument("--rag-stream-docs", type=int, default=24, help="catalogue size (--rag-doc-tokens each)")
    g.add_argument("--rag-stream-zipf", type=float, default=1.0, help="popularity: Zipf exponent over ranks")
    g.add_argument(
        "--rag-stream-new-every", type=int, default=24, help="a new cold document every N requests (0: never)"
    )
    g.add_argument("--rag-stream-rate", type=float, default=12.0, help="Poisson arrivals per second")
    add_rag_chunks_args(g)
    g.add_argument(
        "--rag-chunks-tokenizer",
        default="",
        help="cut the chunks from real text (the standard library's source) tokenized by this",
    )
    g.add_argument("--unique-lengths", type=_ints, default=[8192, 32768, 100000])
    g.add_argument("--unique-reps", type=_ints, default=[4, 3, 2])
    g.add_argument("--mixed-long-n", type=int, default=4)
    g.add_argument("--mixed-long-tokens", type=int, default=32768)
    g.add_argument("--mixed-long-every-s", type=float, default=2.0)
    g.add_argument("--mixed-short-n", type=int, default=48)
    g.add_argument("--mixed-short-min", type=int, default=512)
    g.add_argument("--mixed-short-max", type=int, default=2048)
    g.add_argument("--mixed-short-rate", type=float, default=8.0)
    g.add_argument("--pressure-first-tokens", type=int, default=4096)
    g.add_argument("--pressure-tool-tokens", type=int, default=6144)
    g.add_argument("--pressure-turns", type=int, default=4)
    g.add_argument(
        "--pressure-ratio",
        type=_floats,
        default=[2.0],
        help="working set / KV pool; a list (1.5,2,3) runs one pressure workload per ratio",
    )
    g.add_argument("--pressure-sessions", type=int, default=0, help="0: from the pool size and the ratio")
    g.add_argument("--pressure-max-sessions", type=int, default=16)
    g.add_argument("--pressure-concurrency", type=int, default=2)
    g.add_argument("--doctor-requests", type=int, default=16, help="timestamp, shuffled, sysprompt")
    g.add_argument(
        "--doctor-context-tokens", type=int, default=16384, help="timestamp's context, sysprompt's"
    )
    g.add_argument("--doctor-question-tokens", type=int, default=200)
    g.add_argument("--doctor-preamble-tokens", type=int, default=300, help="shuffled")
    g.add_argument(
        "--doctor-doc-tokens", type=_ints, default=[2900, 4100, 3300, 5000, 3700], help="shuffled's documents"
    )


def add_target_args(p: argparse.ArgumentParser) -> None:
    """The goodput targets, defaults from `bench.lib.goodput.Targets` (`targets_of` reads them back)."""
    t = p.add_argument_group("goodput targets (defaults: issue 27's)")
    t.add_argument(
        "--short-max-tokens", type=int, default=Targets.short_max_tokens, help="short: uncached tokens"
    )
    t.add_argument(
        "--short-ttft-target-ms",
        type=float,
        default=Targets.short_ttft_target_ms,
        help="a short request's TTFT target (as the server's --prefill-ext-short-ttft-target-ms)",
    )
    t.add_argument(
        "--long-ttft-factor",
        type=float,
        default=Targets.long_factor,
        help="a long request's TTFT target: this x the same prompt alone on stock",
    )
    t.add_argument(
        "--tbt-target-ms",
        type=float,
        default=Targets.tbt_target_ms,
        help="every request's TBT p99 target (as the server's --prefill-ext-tbt-target-ms)",
    )
    t.add_argument(
        "--alone-cost",
        default=str(Targets.alone_cost),
        help="alone on stock: FIXED_MS,TOKEN_US,PAIR_PS of stock's passes (bench/lib/goodput.py)",
    )
    t.add_argument(
        "--alone-chunk", type=int, default=Targets.alone_chunk, help="stock's chunked prefill size"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="send workloads to a running server")
    add_client_args(r, DEFAULT_WORKLOADS)
    r.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="unix time; workloads estimated to end past it are skipped",
    )
    r.add_argument("--no-warmup", dest="warmup", action="store_false")
    r.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache before each workload")
    add_workload_args(r)
    add_target_args(r)

    for verb in ("report", "compare"):
        rp = sub.add_parser(verb, help="markdown table + CDF PNG; two summaries give ratios")
        rp.add_argument("summaries", nargs="+", help="[LABEL=]summary.json; give stock first, then ext")
        rp.add_argument("--reference", help="JSON of recorded baseline rows to show alongside")
        rp.add_argument("--out-md")
        rp.add_argument("--out-png", help="TTFT CDFs")
        rp.add_argument("--out-goodput-png", help="CDFs of short requests' TTFT and of time between tokens")

    sub.add_parser("list", help="describe the workloads")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "list":
        for name, fn in WORKLOADS.items():
            print(f"{name:9s} {(fn.__doc__ or '').strip()}")
        return 0
    if a.cmd in ("report", "compare"):
        return report(a)
    if a.token_high <= a.token_low:
        print("--token-high must exceed --token-low", file=sys.stderr)
        return 2
    return asyncio.run(run_workloads(a))


if __name__ == "__main__":
    sys.exit(main())
