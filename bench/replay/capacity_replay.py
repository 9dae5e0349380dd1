#!/usr/bin/env python3
"""Goodput capacity predicted on the CPU: bench/lib/capacity.py's sweep of load factors, each point
replayed through the installed SGLang's real scheduler on bench/replay/mixed_replay.py's simulated
clock (`run_timed`: each pass lasts the cost model's prediction, the model fitted to an H200 pass log
unless given), on the arrival plans the server
bench sends (bench/lib/arrivals.py), for the variants of bench/lib/variants.py.

Writes OUT_DIR/<variant>.json in bench/serving/capacity.py's format, so the measured runs and these
predictions go side by side: `python -m bench.serving.capacity compare <measured ...> --predicted
stock=OUT_DIR/stock.json ...`. Long requests are judged by stock default's time alone, the cost model
with --alone-chunk (the GPU run's `--alone-from` its stock run). A variant slicing a lone prompt's pass
(--prefill-ext-yield-layers) runs its slices on the clock: each its share of the pass plus --slice-gap-ms,
a pass between two slices where the real scheduler forms one; a variant on the normal event loop
(--disable-overlap-schedule) pays --sync-gap-ms between any two passes, as the overlap loop's synced
lone chunks do. Variants the replay cannot run
(PD-multiplexing: its own split prefill on two streams) are left out with a line saying so.

    python -m bench.replay.capacity_replay --out-dir out/replay
    python -m bench.replay.capacity_replay --variants stock ext_gp --workloads mixed --per-point 100

Needs the venv's SGLang patched: `make apply SGLANG_VERSION=<its version>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib.arrivals import mixed_load, mixed_plan, rag_stream_repeating
from bench.lib.capacity import Point, Sweep, capacity
from bench.lib.cost_fit import H200_PASS_LOG, fit_pass_log
from bench.lib.goodput import Targets
from bench.lib.variants import VARIANTS
from bench.replay import mixed_replay as mr
from bench.replay import schedule_replay as sr
from sglang_prefill_ext import harness
from sglang_prefill_ext.runner.pass_cost import PassCost

UNREPLAYABLE = ("--enable-pdmux",)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The workloads' shapes at factor 1: bench/serving/ttft_bench.py's defaults."""

    short_rate: float = 8.0
    long_every_s: float = 2.0
    long_tokens: int = 32768
    short_min: int = 512
    short_max: int = 2048
    rag_rate: float = 12.0
    rag_docs: int = 24
    rag_zipf: float = 1.0
    rag_new_every: int = 24
    doc_tokens: int = 16384
    question_tokens: int = 100
    output: int = 32


def mixed_arrivals(
    shapes: Shapes, factor: float, per_point: int, seed: int
) -> tuple[list[mr.Arrival], float]:
    """The mixed workload at `factor`: its arrivals and short rate."""
    load = mixed_load(shapes.short_rate, shapes.long_every_s, factor, per_point)
    rng = random.Random(seed)
    plan = mixed_plan(
        rng, load.long_n, load.long_every_s, load.short_n, shapes.short_min, shapes.short_max, load.short_rate
    )
    out = mr.mixed_arrivals(plan, shapes.long_tokens, shapes.output, rng)
    return out, load.short_rate


def rag_stream_arrivals(
    shapes: Shapes, factor: float, per_point: int, seed: int
) -> tuple[list[mr.Arrival], float]:
    """The rag-stream workload at `factor`: its arrivals (a document's tokens the same in every request
    about it, a question of its own) and request rate."""
    rate = shapes.rag_rate * factor
    plan = rag_stream_repeating(
        lambda: random.Random(seed), per_point, shapes.rag_docs, shapes.rag_zipf, shapes.rag_new_every, rate
    )
    rng = random.Random(seed + 1)
    docs = {d: sr._tokens(rng, shapes.doc_tokens) for d in sorted(set(plan.doc))}
    seen: set[int] = set()
    out = []
    for i, (at, d) in enumerate(zip(plan.at_s, plan.doc, strict=True)):
        tokens = tuple(docs[d] + sr._tokens(rng, shapes.question_tokens))
        out.append(
            mr.Arrival(
                at * 1e3,
                sr.TraceReq(f"q{i}", tokens, max_new_tokens=shapes.output),
                "hit" if d in seen else "cold",
            )
        )
        seen.add(d)
    return out, rate


WORKLOADS = {"mixed": (mixed_arrivals, "short req/s"), "rag-stream": (rag_stream_arrivals, "req/s")}


def replay_config(flags: str, pool_tokens: int) -> sr.ReplayConfig:
    """A variant's server flags as the replay's config (chunk size, ext, overlap unless disabled)."""
    argv = shlex.split(flags)
    chunk = 8192
    if "--chunked-prefill-size" in argv:
        i = argv.index("--chunked-prefill-size")
        chunk = int(argv[i + 1])
        del argv[i : i + 2]
    overlap = "--disable-overlap-schedule" not in argv
    argv = [x for x in argv if x != "--disable-overlap-schedule"]
    ext = "--enable-prefill-ext" in argv
    argv = [x for x in argv if x != "--enable-prefill-ext"]
    return sr.ReplayConfig(
        ext=ext, chunked_prefill_size=chunk, overlap=overlap, pool_tokens=pool_tokens, extra_args=tuple(argv)
    )


def point_of(
    result: mr.TimedResult,
    arrivals: list[mr.Arrival],
    factor: float,
    rate: float,
    seed: int,
    targets: Targets,
) -> Point:
    verdicts = result.verdicts(targets)
    return Point(
        factor=factor,
        rate=rate,
        seed=seed,
        planned=len(arrivals),
        met=sum(v.met for v in verdicts),
        shorts=sum(v.short for v in verdicts),
        completed=len(verdicts),
        wall_s=round(result.span_ms / 1e3, 3),
    )


def sweep_variant(
    name: str, flags: str, a: argparse.Namespace, cost: PassCost, targets: Targets, shapes: Shapes = Shapes()
) -> dict[str, Any]:
    config = replay_config(flags, a.pool_tokens)
    out: dict[str, Any] = {
        "label": name,
        "goal": a.attainment,
        "seeds": a.seeds,
        "per_point": a.per_point,
        "factors": a.factors,
        "replay": {
            "flags": flags,
            "pass_cost": str(cost),
            "pass_cost_from": "--pass-cost" if a.pass_cost else str(a.pass_log),
            "decode_ms": a.decode_ms,
            "sync_gap_ms": a.sync_gap_ms,
            "slice_gap_ms": a.slice_gap_ms,
            "overlap": config.overlap,
        },
        "targets": targets.as_dict(),
        "workloads": {},
    }
    for w in a.workloads:
        make, unit = WORKLOADS[w]
        sweep = Sweep(a.factors, range(a.seeds), a.attainment, a.below)
        for factor, seed in sweep:
            arrivals, rate = make(shapes, factor, a.per_point, a.seed + seed)
            t0 = time.process_time()
            result = mr.run_timed(
                arrivals,
                config,
                cost,
                decode_ms=a.decode_ms,
                sync_gap_ms=a.sync_gap_ms,
                slice_gap_ms=a.slice_gap_ms,
                normal_gap_ms=0.0 if config.overlap else a.sync_gap_ms,
            )
            sweep.record(point_of(result, arrivals, factor, rate, seed, targets))
            p = sweep.points[-1]
            print(
                f"[{name}] {w} x{factor:g} seed {seed}: met {p.met}/{p.planned} ({p.met / p.planned:.2f}); "
                f"replayed in {time.process_time() - t0:.1f} s CPU",
                file=sys.stderr,
                flush=True,
            )
        base = sweep.points[0].rate / sweep.points[0].factor
        out["workloads"][w] = {
            "unit": unit,
            "base_rate": base,
            "points": [p.as_dict() for p in sweep.points],
            "capacity": capacity(sweep.points, a.attainment, a.seeds, base).as_dict(),
        }
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument(
        "--factors", type=float, nargs="+", default=[2.0, 1.5, 1.0, 0.75, 0.5, 0.35, 0.25, 0.15, 0.1, 0.05]
    )
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--per-point", type=int, default=200)
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--below", type=int, default=1)
    parser.add_argument(
        "--pass-log",
        type=Path,
        default=H200_PASS_LOG,
        help="the simulated clock's pass cost: fitted to this --prefill-ext-pass-log's timed chunks",
    )
    parser.add_argument("--pass-cost", help="FIXED_MS,TOKEN_US,PAIR_PS instead of --pass-log's fit")
    parser.add_argument("--alone-chunk", type=int, default=8192, help="stock default's chunk: the time alone")
    parser.add_argument("--decode-ms", type=float, default=mr.DECODE_MS)
    parser.add_argument(
        "--sync-gap-ms",
        type=float,
        default=mr.SYNC_GAP_MS,
        help="GPU idle before a synced lone chunk, and between any two passes of the normal event loop",
    )
    parser.add_argument(
        "--slice-gap-ms",
        type=float,
        default=mr.SLICE_GAP_MS,
        help="what each layer slice adds to its share of a sliced pass (--prefill-ext-yield-layers)",
    )
    parser.add_argument("--pool-tokens", type=int, default=1 << 20, help="KV slots (the H200's ~700K at 0.8)")
    return parser


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    harness.require_patched()
    cost = PassCost.parse(a.pass_cost) if a.pass_cost else fit_pass_log(a.pass_log)
    print(f"pass cost {cost} ({'given' if a.pass_cost else f'fitted to {a.pass_log}'})", file=sys.stderr)
    targets = Targets(alone_cost=cost, alone_chunk=a.alone_chunk)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name in a.variants:
        flags = VARIANTS[name]
        if any(f in flags for f in UNREPLAYABLE):
            print(
                f"{name}: not replayed ({flags}: PD-multiplexing's streams are not modelled)", file=sys.stderr
            )
            continue
        result = sweep_variant(name, flags, a, cost, targets)
        (a.out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
        caps = ", ".join(
            f"{w} {e['capacity']['rate']:.2f} {e['unit']}" for w, e in result["workloads"].items()
        )
        print(f"{name}: {caps}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
