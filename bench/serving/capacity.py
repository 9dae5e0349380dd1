#!/usr/bin/env python3
"""Goodput capacity of a running server: the highest request rate at which >= --attainment of the
requests meet both targets (bench/lib/goodput.py: short TTFT, long TTFT over its time alone, every
request's TBT p99), per workload, from a sweep of load factors (bench/lib/capacity.py).

Sub-commands:

  run      calibrate (lone prompts, this server's time alone; its fit is the long requests'
           reference unless --alone-from names another run's capacity.json), then per workload sweep
           the load factors, highest first, each over --seeds; OUT_DIR/capacity.json (rewritten after
           every point) and OUT_DIR/requests.jsonl (every request, tagged with its point); with
           --e2e-outputs, then the short requests' end-to-end latency on `mixed` at one load factor
           shared by every variant (--e2e-factor), per output length
  compare  capacities of several runs side by side, each ext* variant over the best stock* one, the
           replay's predictions (--predicted) beside them with their error; the attainment-vs-rate
           curves as a PNG

A load factor scales a workload's whole arrival process (bench/serving/workloads.py): `mixed` its
short rate and its long prompts' rate together, `rag` and `rag-stream` their request rate, `agent`
its session start rate (SESSION_RATE_BASE per second at factor 1 unless --agent-session-rate is set).
Each point sends at least --per-point requests of the workload's unit (mixed: short requests, rag and
rag-stream: repeat questions about a document, agent: requests).

    python -m bench.serving.capacity run --url http://127.0.0.1:30000 --label stock --out-dir out/stock
    python -m bench.serving.capacity compare out/stock/capacity.json out/ext/capacity.json --out-png cap.png
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.lib.arrivals import mixed_load, rag_stream_repeating
from bench.lib.capacity import STOPPED_MISSES, STOPPED_TIMEOUT, Point, Sweep, attainment, by_factor, capacity
from bench.lib.client import Client, Record, flush_cache, server_info, wait_healthy
from bench.lib.goodput import Targets, judge
from bench.lib.stats import percentile
from bench.serving import fit_pass_cost
from bench.serving.report import Panel, plot_panels
from bench.serving.ttft_bench import add_client_args, add_target_args, add_workload_args, targets_of
from bench.serving.workloads import WORKLOADS, Ctx, TokenSource
from sglang_prefill_ext.runner.pass_cost import PassCost

SESSION_RATE_BASE = 1.0  # agent sessions started per second at factor 1 when --agent-session-rate is 0
CALIBRATION_LENGTHS = (4096, 8192, 16384, 32768)


# --------------------------------------------------------------------------------------------
# A workload at a load factor


@dataclasses.dataclass(frozen=True)
class Scaled:
    """A workload's arguments at one load factor: `args`, its `rate` (in `UNITS`) and requests planned."""

    args: argparse.Namespace
    rate: float
    planned: int


def _mixed(a: argparse.Namespace, factor: float, per_point: int, tokens: TokenSource) -> Scaled:
    load = mixed_load(a.mixed_short_rate, a.mixed_long_every_s, factor, per_point)
    a.mixed_short_rate, a.mixed_long_every_s = load.short_rate, load.long_every_s
    a.mixed_short_n, a.mixed_long_n = load.short_n, load.long_n
    return Scaled(a, load.short_rate, load.short_n + load.long_n)


def _rag(a: argparse.Namespace, factor: float, per_point: int, tokens: TokenSource) -> Scaled:
    a.rag_rate *= factor
    a.rag_requests = per_point + a.rag_docs
    return Scaled(a, a.rag_rate, a.rag_requests)


def _rag_stream(a: argparse.Namespace, factor: float, per_point: int, tokens: TokenSource) -> Scaled:
    a.rag_stream_rate *= factor
    plan = rag_stream_repeating(
        lambda: tokens.rng("rag-stream"),
        per_point,
        a.rag_stream_docs,
        a.rag_stream_zipf,
        a.rag_stream_new_every,
        a.rag_stream_rate,
    )
    a.rag_stream_requests = len(plan.doc)
    return Scaled(a, a.rag_stream_rate, a.rag_stream_requests)


def _agent(a: argparse.Namespace, factor: float, per_point: int, tokens: TokenSource) -> Scaled:
    a.agent_session_rate = (a.agent_session_rate or SESSION_RATE_BASE) * factor
    a.agent_sessions = math.ceil(per_point / a.agent_turns)
    return Scaled(a, a.agent_session_rate, a.agent_sessions * a.agent_turns)


UNITS = {"mixed": "short req/s", "rag": "req/s", "rag-stream": "req/s", "agent": "sessions/s"}
SCALES: dict[str, Callable[[argparse.Namespace, float, int, TokenSource], Scaled]] = {
    "mixed": _mixed,
    "rag": _rag,
    "rag-stream": _rag_stream,
    "agent": _agent,
}


def scaled(
    workload: str, a: argparse.Namespace, factor: float, per_point: int, tokens: TokenSource
) -> Scaled:
    return SCALES[workload](copy.copy(a), factor, per_point, tokens)


# --------------------------------------------------------------------------------------------
# One point


def verdict_met(rec: Record, targets: Targets) -> bool:
    if rec.error is not None or rec.ttft_s is None:
        return False
    return judge(rec.prompt_tokens, rec.cached_tokens or 0, rec.ttft_s, rec.tbt_s, targets).met


def is_short(rec: Record, targets: Targets) -> bool:
    return targets.is_short(rec.prompt_tokens - (rec.cached_tokens or 0))


def certain_misses(client: Client, targets: Targets, now: float) -> int:
    """Completed requests that missed, and those still waiting for a first token past the loosest
    target their prompt could have (whatever of it turns out cached)."""
    done = sum(not verdict_met(r, targets) for r in client.records)
    waiting = sum(
        1
        for rec, start in list(client.in_flight.values())
        if rec.ttft_s is None and now - start > targets.loosest_ttft_target_s(rec.prompt_tokens)
    )
    return done + waiting


async def settle(url: str, timeout_s: float = 60.0) -> None:
    """Until the server is idle (SGLang flushes its cache only then): the next point starts cold."""
    end = time.monotonic() + timeout_s
    while not await asyncio.to_thread(flush_cache, url) and time.monotonic() < end:
        await asyncio.sleep(1.0)


async def run_point(
    client: Client,
    a: argparse.Namespace,
    workload: str,
    at: tuple[float, int],
    point: Scaled,
    budget: int,
    targets: Targets,
    pool_tokens: int | None,
) -> tuple[Point, list[Record]]:
    """The workload's `point` at `at` (factor, seed), stopped once its certain misses pass `budget` or it
    runs past --point-timeout-s; requests cut off are cancelled (SGLang aborts them) and miss."""
    factor, seed = at
    tokens = TokenSource(a.seed + seed, a.token_low, a.token_high)
    await settle(client.url)
    client.records.clear()
    ctx = Ctx(client, tokens, point.args, pool_tokens)
    task = asyncio.ensure_future(WORKLOADS[workload](ctx, workload))
    t0 = time.perf_counter()
    stopped = None
    while not task.done():
        await asyncio.wait({task}, timeout=0.1)
        now = time.perf_counter()
        if task.done():
            break
        if certain_misses(client, targets, now) > budget:
            stopped = STOPPED_MISSES
        elif now - t0 > a.point_timeout_s:
            stopped = STOPPED_TIMEOUT
        if stopped:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if not stopped:
        task.result()  # a workload's own error ends the run
    records = list(client.records)
    result = Point(
        factor=factor,
        rate=point.rate,
        seed=seed,
        planned=point.planned,
        met=sum(verdict_met(r, targets) for r in records),
        shorts=sum(r.ttft_s is not None and is_short(r, targets) for r in records),
        completed=len(records),
        stopped=stopped,
        wall_s=round(time.perf_counter() - t0, 3),
    )
    return result, records


# --------------------------------------------------------------------------------------------
# Calibration: this server's time alone


async def calibrate(
    client: Client, tokens: TokenSource, lengths: Sequence[int], reps: int
) -> dict[str, list[float]]:
    """TTFT of lone uncached prompts of each length (one output token), one at a time."""
    out: dict[str, list[float]] = {}
    for rep in range(reps):
        for n in lengths:
            rec = await client.generate(
                tokens.ids(n, "calibration", rep, n),
                workload="calibration",
                group=str(n),
                idx=rep,
                t0=time.perf_counter(),
                max_new_tokens=1,
            )
            if rec.ttft_s is not None and not rec.cached_tokens:
                out.setdefault(str(n), []).append(rec.ttft_s)
    return out


def alone_targets(a: argparse.Namespace, ttfts: dict[str, list[float]], chunk: int) -> Targets:
    """The targets, long requests judged against `chunk`-token passes fitted to the lone TTFTs."""
    samples = [(int(n), t) for n, ts in ttfts.items() for t in ts]
    cost = fit_pass_cost.fit(samples, chunk)
    return dataclasses.replace(targets_of(a), alone_cost=cost, alone_chunk=chunk)


async def reference_targets(a: argparse.Namespace, own: Targets) -> Targets:
    """The targets with another run's fitted time alone (--alone-from), once its calibration is there
    (a run beside this one may still be calibrating: --alone-wait-s); else `own`."""
    end = time.monotonic() + a.alone_wait_s
    while a.alone_from:
        path = Path(a.alone_from)
        calibration = json.loads(path.read_text()).get("calibration") if path.exists() else None
        if calibration:
            cost = PassCost.parse(calibration["alone_cost"])
            return dataclasses.replace(own, alone_cost=cost, alone_chunk=calibration["chunk"])
        if time.monotonic() > end:
            print(
                f"{path}: no calibration after {a.alone_wait_s:.0f} s; judged by this server's own",
                file=sys.stderr,
            )
            break
        await asyncio.sleep(2.0)
    return own


# --------------------------------------------------------------------------------------------
# run


async def run(a: argparse.Namespace) -> int:
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    url = a.url.rstrip("/")
    if not wait_healthy(url, a.health_timeout):
        print(f"server at {url} is not healthy after {a.health_timeout:.0f} s", file=sys.stderr)
        return 2
    names = [w.strip() for w in a.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in SCALES]
    if unknown:
        print(f"cannot sweep {unknown}; choose from {', '.join(SCALES)}", file=sys.stderr)
        return 2
    info = server_info(url)
    chunk = info.get("chunked_prefill_size") or a.alone_chunk
    if chunk <= 0:  # chunked prefill off: a prompt alone is one pass
        chunk = 1 << 30
    result: dict[str, Any] = {
        "label": a.label,
        "goal": a.attainment,
        "seeds": a.seeds,
        "per_point": a.per_point,
        "factors": a.factors,
        "server": info,
        "workloads": {},
    }
    summary = out_dir / "capacity.json"
    (out_dir / "requests.jsonl").write_text("")  # this run's requests only, as capacity.json
    async with Client(url, a.label, None, progress=False) as client:
        await settle(url)
        ttfts = await calibrate(
            client, TokenSource(a.seed, a.token_low, a.token_high), a.calibration_lengths, a.calibration_reps
        )
        own = alone_targets(a, ttfts, chunk)
        targets = await reference_targets(a, own)
        result["calibration"] = {"chunk": chunk, "alone_cost": str(own.alone_cost), "ttft_s": ttfts}
        result["alone_from"] = a.alone_from
        result["targets"] = targets.as_dict()
        print(
            f"[{a.label}] alone: {own.alone_cost} (chunk {chunk}); judged by {targets.alone_cost}", flush=True
        )
        for w in names:
            entry = result["workloads"][w] = {"unit": UNITS[w], "points": []}
            await sweep_workload(client, a, w, targets, info, entry, lambda: write(summary, result))
        if a.e2e_outputs:
            result["short_e2e"] = await short_e2e(client, a, targets, info.get("max_total_num_tokens"))
            write(summary, result)
    return 0


async def short_e2e(
    client: Client, a: argparse.Namespace, targets: Targets, pool_tokens: int | None
) -> dict[str, Any]:
    """The short requests' end-to-end latencies (s, sorted) on `mixed` at --e2e-factor, a point per
    output length of --e2e-outputs and each of --e2e-seeds, run to its end: the shorts' decode under load."""
    by_output: dict[str, list[float]] = {}
    stopped = []
    for n_out in a.e2e_outputs:
        args = copy.copy(a)
        args.max_new_tokens = n_out
        e2e: list[float] = []
        for seed in range(a.e2e_seeds):
            tokens = TokenSource(a.seed + seed, a.token_low, a.token_high)
            point = scaled("mixed", args, a.e2e_factor, a.e2e_per_point, tokens)
            done, records = await run_point(
                client, args, "mixed", (a.e2e_factor, seed), point, point.planned, targets, pool_tokens
            )
            stopped += [f"{n_out} tokens, seed {seed}: {done.stopped}"] if done.stopped else []
            e2e += [
                r.e2e_s for r in records if r.error is None and r.e2e_s is not None and is_short(r, targets)
            ]
        by_output[str(n_out)] = sorted(e2e)
        print(
            f"[{a.label}] short e2e at mixed x{a.e2e_factor:g}, {n_out} tokens: p50 "
            f"{percentile(e2e, 50) or 0:.3f} s, p99 {percentile(e2e, 99) or 0:.3f} s ({len(e2e)} shorts)",
            flush=True,
        )
    return {"factor": a.e2e_factor, "e2e_s": by_output, "stopped": stopped}


async def sweep_workload(
    client: Client,
    a: argparse.Namespace,
    w: str,
    targets: Targets,
    info: dict[str, Any],
    entry: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """The sweep of workload `w` into `entry` (its points, capacity), `save`d after every point; every
    request into OUT_DIR/requests.jsonl, tagged with its factor and seed."""
    sweep = Sweep(a.factors, range(a.seeds), a.attainment, a.below)
    for factor, seed in sweep:
        point = scaled(w, a, factor, a.per_point, TokenSource(a.seed + seed, a.token_low, a.token_high))
        if a.deadline and time.time() + point.planned / point.rate > a.deadline:
            entry["deadline"] = f"x{factor:g} and below not run: past --deadline"
            break
        budget = sweep.miss_budget(factor, point.planned)
        done, records = await run_point(
            client, a, w, (factor, seed), point, budget, targets, info.get("max_total_num_tokens")
        )
        sweep.record(done)
        with open(Path(a.out_dir) / "requests.jsonl", "a") as f:
            for rec in records:
                f.write(json.dumps({**rec.to_json(), "factor": factor, "seed": seed}) + "\n")
        entry["points"].append(done.as_dict())
        entry["base_rate"] = done.rate / factor
        entry["capacity"] = capacity(sweep.points, a.attainment, a.seeds, entry["base_rate"]).as_dict()
        save()
        print(
            f"[{a.label}] {w} x{factor:g} seed {seed}: {done.rate:.2f} {entry['unit']}, "
            f"met {done.met}/{done.planned} ({done.met / done.planned:.2f}), shorts {done.shorts}, "
            f"{done.wall_s:.0f} s{', stopped: ' + done.stopped if done.stopped else ''}",
            flush=True,
        )
    cap = entry.get("capacity", {"rate": 0.0, "factor": 0.0})
    print(f"[{a.label}] {w}: capacity {cap['rate']:.2f} {entry['unit']} (x{cap['factor']:g})", flush=True)


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1))


# --------------------------------------------------------------------------------------------
# compare


def load(spec: str) -> tuple[str, dict[str, Any]]:
    """`[LABEL=]capacity.json`: its label (default: the run's) and content, its path as `path`."""
    label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
    data = {**json.loads(Path(path).read_text()), "path": path}
    return label or data.get("label") or Path(path).parent.name, data


def at_capacity(run: dict[str, Any], workload: str) -> list[dict[str, Any]]:
    """The requests of `workload` at the run's capacity factor, from the request log beside it."""
    log = Path(run["path"]).parent / "requests.jsonl"
    factor = run["workloads"][workload]["capacity"]["factor"]
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [r for r in rows if r["workload"] == workload and r["factor"] == factor]


def cdf_panels(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[Panel]:
    """Per workload, at each variant's capacity: its short requests' TTFT and every time between tokens."""
    panels: list[Panel] = []
    for w in workloads_of(runs):
        short, gaps = [], []
        for label, run in runs:
            if w not in run.get("workloads", {}):
                continue
            rows = at_capacity(run, w)
            limit = run["targets"]["short_max_tokens"]
            name = f"{label} x{run['workloads'][w]['capacity']['factor']:g}"
            ttfts = sorted(
                r["ttft_s"]
                for r in rows
                if r["ttft_s"] is not None and r["prompt_tokens"] - (r["cached_tokens"] or 0) <= limit
            )
            if ttfts:
                short.append((name, ttfts))
            if tbts := sorted(g for r in rows for g in r["tbt_s"]):
                gaps.append((name, tbts))
        panels += [(f"{w}: short requests at capacity", "TTFT (s)", short)] if short else []
        panels += [(f"{w}: time between tokens at capacity", "TBT (s)", gaps)] if gaps else []
    return panels


def workloads_of(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    names: list[str] = []
    for _, run in runs:
        names += [w for w in run.get("workloads", {}) if w not in names]
    return names


def cap_rate(run: dict[str, Any], workload: str) -> float | None:
    entry = run.get("workloads", {}).get(workload)
    return None if entry is None or "capacity" not in entry else entry["capacity"]["rate"]


def best_stock(runs: Sequence[tuple[str, dict[str, Any]]], workload: str) -> tuple[str, float] | None:
    known = [
        (label, c)
        for label, run in runs
        if label.startswith("stock") and (c := cap_rate(run, workload)) is not None
    ]
    return max(known, key=lambda x: x[1]) if known else None


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    if b == 0:
        return "inf" if a > 0 else "-"
    return f"{a / b:.2f}"


def lone_rows(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each run's calibration (lone prompts, nothing cached): median TTFT per length and its ratio to
    the first run's (stock, when it ran)."""
    medians = {
        label: {
            int(n): statistics.median(ts) for n, ts in run.get("calibration", {}).get("ttft_s", {}).items()
        }
        for label, run in runs
    }
    lengths = sorted({n for m in medians.values() for n in m})
    if not lengths:
        return []
    ref_label, ref = runs[0][0], medians[runs[0][0]]
    lines = [
        f"### Lone prompts (calibration, median TTFT s; / {ref_label})",
        "",
        "| variant |" + "".join(f" {n:,} |" for n in lengths),
        "|---|" + "---:|" * len(lengths),
    ]
    for label, m in medians.items():
        cells = [
            ""
            if n not in m
            else f"{m[n]:.3f}" + (f" ({m[n] / ref[n]:.3f})" if n in ref and label != ref_label else "")
            for n in lengths
        ]
        lines.append(f"| {label} |" + "".join(f" {c} |" for c in cells))
    return [*lines, ""]


def e2e_rows(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each run's short requests' end-to-end latency per output length (p50, p99) and its ratio to
    stock's (the run labelled `stock`, else the first stock* one)."""
    e2e = {label: run["short_e2e"] for label, run in runs if run.get("short_e2e")}
    if not e2e:
        return []
    stock = [label for label in e2e if label == "stock"] or [
        label for label in e2e if label.startswith("stock")
    ]
    ref = e2e[stock[0]] if stock else None
    outputs = sorted({int(n) for v in e2e.values() for n in v["e2e_s"]})
    qs = (50, 99)
    lines = [
        f"### Short requests' end-to-end latency on mixed (s; / {stock[0] if stock else '-'})",
        "",
        "| variant | factor |" + "".join(f" {n} tokens p{q} |" for n in outputs for q in qs) + " shorts |",
        "|---|---:|" + "---:|" * (len(outputs) * len(qs) + 1),
    ]
    for label, v in e2e.items():
        cells = []
        for n in outputs:
            for q in qs:
                mine = percentile(v["e2e_s"].get(str(n), []), q)
                base = None if ref is None else percentile(ref["e2e_s"].get(str(n), []), q)
                ratio = f" ({mine / base:.2f})" if mine is not None and base and v is not ref else ""
                cells.append("-" if mine is None else f"{mine:.3f}{ratio}")
        counts = "/".join(str(len(v["e2e_s"].get(str(n), []))) for n in outputs)
        stopped = " (stopped: " + "; ".join(v["stopped"]) + ")" if v.get("stopped") else ""
        lines.append(
            f"| {label} | {v['factor']:g} |" + "".join(f" {c} |" for c in cells) + f" {counts}{stopped} |"
        )
    return [*lines, ""]


def render(
    runs: Sequence[tuple[str, dict[str, Any]]], predicted: Sequence[tuple[str, dict[str, Any]]]
) -> str:
    workloads = workloads_of(runs)
    pred = dict(predicted)
    lines: list[str] = lone_rows(runs) + e2e_rows(runs)
    for w in workloads:
        entry = next(run["workloads"][w] for _, run in runs if w in run.get("workloads", {}))
        best = best_stock(runs, w)
        pbest = best_stock(predicted, w)
        lines += [
            f"### {w}: capacity at >= {runs[0][1].get('goal', 0.9):.0%} of requests within both targets "
            f"({entry.get('unit', '')})",
            "",
            "| variant | capacity | factor | next factor (failing) | / best stock | replay | replay / measured | replay / best stock (replay) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, run in runs:
            e = run.get("workloads", {}).get(w)
            if e is None or "capacity" not in e:
                lines.append(f"| {label} | - | - | - | - | - | - | - |")
                continue
            c = e["capacity"]
            p = cap_rate(pred[label], w) if label in pred else None
            lines.append(
                f"| {label} | {'' if c['failing_factor'] is not None else '≥ '}{c['rate']:.2f} | {c['factor']:g} | {c['failing_factor'] if c['failing_factor'] is not None else '-'} | "
                f"{_ratio(c['rate'], best[1]) if best else '-'} | {'-' if p is None else f'{p:.2f}'} | "
                f"{_ratio(p, c['rate'])} | {_ratio(p, pbest[1]) if pbest and p is not None else '-'} |"
            )
        if best:
            lines += ["", f"Best stock: {best[0]} ({best[1]:.2f})."]
        lines += [
            "",
            "Attainment per factor (pooled over seeds; ≤: a point stopped early, an upper bound):",
            "",
        ]
        factors = sorted(
            {p["factor"] for _, run in runs for p in run.get("workloads", {}).get(w, {}).get("points", [])},
            reverse=True,
        )
        lines += ["| variant |" + "".join(f" x{f:g} |" for f in factors), "|---|" + "---:|" * len(factors)]
        for label, run in runs:
            groups = by_factor(Point(**p) for p in run.get("workloads", {}).get(w, {}).get("points", []))
            cells = []
            for f in factors:
                ps = groups.get(f)
                cells.append(
                    "" if not ps else f"{'≤' if any(p.stopped for p in ps) else ''}{attainment(ps):.2f}"
                )
            lines.append(f"| {label} |" + "".join(f" {c} |" for c in cells))
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[tuple[str, dict[str, Any]]], png: Path) -> bool:
    """Attainment vs offered rate, a panel per workload, a line per variant (hollow: stopped early)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no capacity plot", file=sys.stderr)
        return False
    workloads = workloads_of(runs)
    if not workloads:
        return False
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 3.8), squeeze=False)
    for ax, w in zip(axes.flat, workloads, strict=True):
        goal = 0.9
        for label, run in runs:
            entry = run.get("workloads", {}).get(w)
            if not entry:
                continue
            goal = run.get("goal", goal)
            groups = sorted(by_factor(Point(**p) for p in entry["points"]).items())
            xs = [ps[0].rate for _, ps in groups]
            ys = [attainment(ps) for _, ps in groups]
            (line,) = ax.plot(xs, ys, "-", label=f"{label} ({entry['capacity']['rate']:.2f})")
            for (_, ps), x, y in zip(groups, xs, ys, strict=True):
                stopped = any(p.stopped for p in ps)
                ax.plot([x], [y], "o", color=line.get_color(), mfc="none" if stopped else line.get_color())
        ax.axhline(goal, color="grey", linestyle=":", linewidth=1)
        ax.set_title(w)
        ax.set_xlabel(f"offered rate ({entry.get('unit', '') if entry else ''})")
        ax.set_ylabel("requests within both targets")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def compare(a: argparse.Namespace) -> int:
    runs = [load(s) for s in a.runs]
    predicted = [load(s) for s in a.predicted or []]
    md = render(runs, predicted)
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md)
    if a.out_png:
        plot(runs, Path(a.out_png))
    if a.out_cdf_png:
        plot_panels(cdf_panels(runs), Path(a.out_cdf_png))
    return 0


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="sweep a running server")
    add_client_args(r, ("mixed", "rag-stream"))
    s = r.add_argument_group("the sweep")
    s.add_argument(
        "--factors",
        type=_floats,
        default=[2.0, 1.5, 1.0, 0.75, 0.5, 0.35, 0.25, 0.15, 0.1],
        help="load factors",
    )
    s.add_argument("--seeds", type=int, default=2, help="seeds per factor (added to --seed)")
    s.add_argument(
        "--per-point", type=int, default=200, help="requests of the workload's unit per point and seed"
    )
    s.add_argument("--attainment", type=float, default=0.9, help="the share of requests within both targets")
    s.add_argument("--below", type=int, default=1, help="factors run after the first meeting --attainment")
    s.add_argument("--point-timeout-s", type=float, default=180.0)
    s.add_argument("--calibration-lengths", type=_ints, default=list(CALIBRATION_LENGTHS))
    s.add_argument("--calibration-reps", type=int, default=2)
    s.add_argument(
        "--alone-from", help="judge long requests by this run's capacity.json calibration (stock's)"
    )
    s.add_argument(
        "--alone-wait-s", type=float, default=0.0, help="wait this long for --alone-from's calibration"
    )
    s.add_argument(
        "--deadline", type=float, default=0.0, help="unix time; points that would end past it are not run"
    )
    s.add_argument(
        "--e2e-outputs",
        type=_ints,
        default=[],
        help="after the sweeps, the short requests' end-to-end latency on mixed at these output lengths",
    )
    s.add_argument(
        "--e2e-factor",
        type=float,
        default=0.15,
        help="the load factor of that phase, the same for every variant",
    )
    s.add_argument("--e2e-per-point", type=int, default=100, help="short requests per output length and seed")
    s.add_argument("--e2e-seeds", type=int, default=1, help="seeds of that phase")
    add_workload_args(r)
    add_target_args(r)
    c = sub.add_parser("compare", help="capacities side by side, ratios, curves")
    c.add_argument("runs", nargs="+", help="[LABEL=]capacity.json, measured")
    c.add_argument(
        "--predicted", nargs="*", help="[LABEL=]capacity.json of the replay, LABEL as the measured run's"
    )
    c.add_argument("--out-md")
    c.add_argument("--out-png", help="attainment vs offered rate")
    c.add_argument("--out-cdf-png", help="short requests' TTFT and the TBT at each variant's capacity")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "compare":
        return compare(a)
    return asyncio.run(run(a))


if __name__ == "__main__":
    sys.exit(main())
