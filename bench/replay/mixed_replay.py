#!/usr/bin/env python3
"""Short requests arriving during long chunked prefills, replayed on the CPU through the installed
SGLang's real scheduler (bench/replay/schedule_replay.py's `ReplayScheduler`), stock vs ext, on a simulated
clock.

Each pass's forward time is predicted by the extension's cost model (`PassCost`, constants fitted on
the H200) from the batch the real scheduler formed; requests arrive by that clock (the mixed
workload of bench/serving/ttft_bench.py: long unique prompts every few seconds among Poisson short ones).
With --overlap (SGLang's default event loop) batch k + 1 is formed while batch k runs, so a request
arriving during batch k can ride batch k + 2 at the earliest. TTFT here is scheduler-side: arrival
to the end of the forward holding the prompt's last chunk (no HTTP, no detokenization).

    python -m bench.replay.mixed_replay --overlap
    python -m bench.replay.mixed_replay --overlap --budget-ms 60 100 --stock-chunk 8192 2048
    python -m bench.replay.mixed_replay --overlap --budget-ms --tbt-target-ms 100 --mixed-chunk

Besides TTFT it reports time between tokens (each token at the end of the forward that made it) and
goodput at bench/lib/goodput.py's default targets. A request decodes from the pass after its last
chunk's, with or without --overlap, as in SGLang (`get_next_batch_to_run` merges the last batch
into the running one before forming the next, even while the last one's result is pending).

Needs the venv's SGLang patched: `make apply SGLANG_VERSION=<its version>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.lib.arrivals import MixedPlan
from bench.lib.goodput import Targets, Verdict, judge, summarize_goodput
from bench.replay import schedule_replay as sr
from sglang_prefill_ext import harness
from sglang_prefill_ext.runner.pass_cost import PassCost

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

# One decode step of a few requests, 8B shape on the H200: stock's 114 tok/s per request (mixed workload).
DECODE_MS = 8.8
# The GPU idles while the patched overlap loop forms a lone prompt's next chunk after the last one's
# result (--prefill-ext-lone-chunk-sync): the CPU's result processing and batch forming, an estimate (the
# H200 pass log shows ~8-10 ms from one pass's forming to the next's with the forward's launch between).
SYNC_GAP_MS = 3.0
# What a layer slice adds to its share of the pass (--prefill-ext-yield-layers): one more forward's launch
# and, after a pass between slices, the attention metadata's re-init; an estimate, not measured yet.
SLICE_GAP_MS = 1.0


@dataclasses.dataclass(frozen=True)
class Arrival:
    ms: float
    req: sr.TraceReq
    group: str  # "long" or "short"


def mixed(
    long_n: int = 4,
    long_tokens: int = 32768,
    long_every_ms: float = 2000.0,
    short_n: int = 48,
    short_min: int = 512,
    short_max: int = 2048,
    short_rate: float = 8.0,
    seed: int = 5,
    output: int = 1,
) -> list[Arrival]:
    """bench/serving/ttft_bench.py's mixed workload: long unique prompts every `long_every_ms` among
    `short_n` short unique prompts arriving as a Poisson process of `short_rate` per second; each
    request generates `output` tokens (the GPU workload's: 32)."""
    rng = random.Random(seed)
    out = [
        Arrival(
            i * long_every_ms,
            sr.TraceReq(f"long{i}", tuple(sr._tokens(rng, long_tokens)), max_new_tokens=output),
            "long",
        )
        for i in range(long_n)
    ]
    t = rng.expovariate(short_rate) * 1e3
    for j in range(short_n):
        n = rng.randint(short_min, short_max)
        out.append(
            Arrival(t, sr.TraceReq(f"short{j}", tuple(sr._tokens(rng, n)), max_new_tokens=output), "short")
        )
        t += rng.expovariate(short_rate) * 1e3
    return sorted(out, key=lambda a: a.ms)


def mixed_arrivals(plan: MixedPlan, long_tokens: int, output: int, rng: random.Random) -> list[Arrival]:
    """`plan`'s requests (bench/lib/arrivals.py, the server bench's own plan) with token ids from `rng`."""
    longs = [
        Arrival(
            at * 1e3,
            sr.TraceReq(f"long{i}", tuple(sr._tokens(rng, long_tokens)), max_new_tokens=output),
            "long",
        )
        for i, at in enumerate(plan.long_s)
    ]
    shorts = [
        Arrival(at * 1e3, sr.TraceReq(f"short{j}", tuple(sr._tokens(rng, n)), max_new_tokens=output), "short")
        for j, (at, n) in enumerate(zip(plan.short_s, plan.short_tokens, strict=True))
    ]
    return sorted(longs + shorts, key=lambda a: a.ms)


@dataclasses.dataclass
class TimedResult:
    mode: str
    ttft_ms: dict[str, float]  # rid -> scheduler-side TTFT
    e2e_ms: dict[str, float]  # rid -> arrival to its last token
    tbt_ms: dict[str, list[float]]  # rid -> gaps between its tokens (each at its forward's end)
    token_passes: dict[
        str, list[int]
    ]  # rid -> the forwards (prefill or decode, counted from 0) giving it a token
    chunks: dict[str, int]  # rid -> passes its prompt was computed in
    cached: dict[str, int]  # rid -> prompt tokens it found cached at its first admission
    groups: dict[str, str]
    prompt_tokens: dict[str, int]
    span_ms: float  # the first arrival to the last token
    passes: int
    prefill_tokens: int
    busy_ms: float
    kv_errors: list[str]

    def group_ttfts(self, group: str) -> list[float]:
        return [v for rid, v in self.ttft_ms.items() if self.groups[rid] == group]

    def group_e2es(self, group: str) -> list[float]:
        return [v for rid, v in self.e2e_ms.items() if self.groups[rid] == group]

    def gaps(self) -> list[float]:
        return [g for gaps in self.tbt_ms.values() for g in gaps]

    def verdicts(self, targets: Targets) -> list[Verdict]:
        """bench/lib/goodput.py's verdict of every request that got its first token."""
        return [
            judge(
                self.prompt_tokens[rid],
                self.cached.get(rid, 0),
                ms / 1e3,
                [g / 1e3 for g in self.tbt_ms.get(rid, [])],
                targets,
            )
            for rid, ms in self.ttft_ms.items()
        ]

    def goodput(self, targets: Targets) -> dict[str, Any]:
        """bench/lib/goodput.py's numbers on the simulated clock."""
        return summarize_goodput(self.verdicts(targets), len(self.groups), self.span_ms / 1e3)


def run_timed(
    arrivals: Sequence[Arrival],
    config: sr.ReplayConfig,
    cost: PassCost,
    check_kv: bool = False,
    decode_ms: float = DECODE_MS,
    sync_gap_ms: float = SYNC_GAP_MS,
    slice_gap_ms: float = SLICE_GAP_MS,
    normal_gap_ms: float = 0.0,
) -> TimedResult:
    """Replay `arrivals` on the simulated clock; each formed prefill batch lasts `cost`'s prediction,
    each decode step `decode_ms`, and a batch formed after the last one's result (no overlap for a lone
    prompt's chunk) starts `sync_gap_ms` after it. A pass run in layer slices (--prefill-ext-yield-layers)
    lasts its slices', each its share of the pass plus `slice_gap_ms`, with the requests that arrived by
    a slice's end received there and the passes run between slices on the same clock. Without overlap
    each pass starts `normal_gap_ms` after the last one ended (the CPU's result processing and forming,
    which the overlap loop hides; bench.replay.capacity_replay charges it the sync gap)."""
    replay = sr.ReplayScheduler(config)
    timer = _Timer(arrivals, replay, cost, decode_ms, check_kv, slice_gap_ms, normal_gap_ms)
    runner = getattr(replay.scheduler, "prefill_ext_scheduler", None)
    if runner is not None:
        runner.clock = lambda: timer.clock_ms / 1e3
    replay.slice_clock = timer
    while timer.todo or replay.busy():
        timer.receive()
        before, decoded, done = len(replay.steps), replay.decode_steps, set(replay.finished)
        replay.step()
        step = replay.steps[before]
        timer.check()
        if step.admitted or replay.decode_steps > decoded:
            start = timer.ran(step, decode=not step.admitted)
            # The next batch is formed once this one is launched (overlap) or has finished.
            if not config.overlap:
                timer.clock_ms = timer.gpu_free + normal_gap_ms
            elif replay.forms_after_result():
                timer.clock_ms = timer.gpu_free + sync_gap_ms
            else:
                timer.clock_ms = start
        elif timer.todo and not replay.busy():
            timer.clock_ms = max(timer.clock_ms, timer.todo[0].ms)
        else:
            timer.clock_ms = max(timer.clock_ms, timer.gpu_free)
        for rid in set(replay.finished) - done:  # its last token: the forward just predicted
            timer.e2e[rid] = timer.gpu_free - timer.arrived[rid]
    arrived, e2e = timer.arrived, timer.e2e
    return TimedResult(
        mode="",
        ttft_ms=timer.ttft,
        e2e_ms=e2e,
        tbt_ms={rid: [b - a for a, b in itertools.pairwise(ts)] for rid, ts in timer.token_ms.items()},
        token_passes=timer.token_passes,
        chunks=timer.chunks,
        cached=timer.cached,
        groups={a.req.rid: a.group for a in arrivals},
        prompt_tokens=timer.lengths,
        span_ms=max(arrived[rid] + ms for rid, ms in e2e.items()) - min(arrived.values()),
        passes=sum(1 for s in replay.steps if s.admitted),
        prefill_tokens=replay.prefill_tokens,
        busy_ms=timer.busy,
        kv_errors=timer.errors,
    )


class _Timer(sr.SliceClock):
    """`run_timed`'s simulated clock and what it records per request; as the replay's `SliceClock`,
    it times a sliced pass's slices and the passes between them."""

    def __init__(
        self,
        arrivals: Sequence[Arrival],
        replay: sr.ReplayScheduler,
        cost: PassCost,
        decode_ms: float,
        check_kv: bool,
        slice_gap_ms: float,
        normal_gap_ms: float,
    ) -> None:
        self.todo = list(arrivals)
        self.replay, self.cost, self.decode_ms, self.check_kv = replay, cost, decode_ms, check_kv
        self.slice_gap_ms, self.normal_gap_ms = slice_gap_ms, normal_gap_ms
        self.lengths = {a.req.rid: len(a.req.tokens) for a in arrivals}
        self.clock_ms = self.gpu_free = self.busy = 0.0
        self.arrived: dict[str, float] = {}
        self.ttft: dict[str, float] = {}
        self.e2e: dict[str, float] = {}
        self.chunks: dict[str, int] = {}
        self.cached: dict[str, int] = {}
        self.token_ms: dict[str, list[float]] = {}
        self.token_passes: dict[str, list[int]] = {}
        self.forwards = 0
        self.errors: list[str] = []

    def receive(self) -> None:
        while self.todo and self.todo[0].ms <= self.clock_ms:
            a = self.todo.pop(0)
            self.replay.add(a.req)
            self.arrived[a.req.rid] = a.ms

    def check(self) -> None:
        if self.check_kv:
            self.errors += self.replay.kv_accounting_errors()

    def _pass_ms(self, admitted: list[tuple[str, int, int]]) -> float:
        return self.cost.fixed_ms + sum(
            self.cost.variable_ms(end - begin, begin) for _, begin, end in admitted
        )

    def slice(self, batch: ScheduleBatch, fraction: float) -> None:
        self.check()  # here the pass between the last two slices has joined the running batch
        admitted = [(r.rid, *self.replay.kit.extend_range(r)) for r in batch.reqs]
        self._advance(fraction * self._pass_ms(admitted) + self.slice_gap_ms)
        self.clock_ms = self.gpu_free

    def passed(self, step: sr.StepRecord, decode: bool) -> None:
        self.clock_ms = self.gpu_free + self.normal_gap_ms  # formed once the last slice ended
        self.ran(step, decode)
        self.clock_ms = self.gpu_free

    def _advance(self, ms: float) -> float:
        start = max(self.clock_ms, self.gpu_free)
        self.gpu_free = start + ms
        self.busy += ms
        return start

    def ran(self, step: sr.StepRecord, decode: bool) -> float:
        """A pass ran (a sliced one's slices already took their time): its tokens at its end; its start."""
        start = self._advance(
            0.0 if step.sliced else self.decode_ms if decode else self._pass_ms(step.admitted)
        )
        prompts = [(rid, end) for rid, _, end in step.admitted if rid not in step.riding]
        for rid, begin, _ in step.admitted:
            self.cached.setdefault(rid, begin)
        for rid, end in prompts:
            self.chunks[rid] = self.chunks.get(rid, 0) + 1
            if end == self.lengths[rid] and rid not in self.ttft:
                self.ttft[rid] = self.gpu_free - self.arrived[rid]
        last_chunks = [rid for rid, end in prompts if end == self.lengths[rid]]
        for rid in last_chunks + step.decoded:
            self.token_ms.setdefault(rid, []).append(self.gpu_free)
            self.token_passes.setdefault(rid, []).append(self.forwards)
        self.forwards += 1
        return start


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def table(results: list[TimedResult], targets: Targets) -> str:
    lines = [
        "| mode | short TTFT p50 ms | short TTFT p99 ms | long TTFT p50 ms | short end-to-end p50 ms | "
        "TBT p50 ms | TBT p99 ms | within both targets | goodput req/s | passes | busy ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        short, long, done, gaps = (
            r.group_ttfts("short"),
            r.group_ttfts("long"),
            r.group_e2es("short"),
            r.gaps(),
        )
        good = r.goodput(targets)
        lines.append(
            f"| {r.mode} | {statistics.median(short):.0f} | {_pct(short, 99):.0f} | "
            f"{statistics.median(long):.0f} | {statistics.median(done):.0f} | {_pct(gaps, 50):.0f} | "
            f"{_pct(gaps, 99):.0f} | {good['slo_attainment']:.2f} | {good['goodput_req_s']:.2f} | "
            f"{r.passes} | {r.busy_ms:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--overlap", action="store_true", help="SGLang's overlap event loop (its default)")
    parser.add_argument("--budget-ms", type=float, nargs="*", default=[100.0], help="ext pass budgets")
    parser.add_argument(
        "--tbt-target-ms", type=float, nargs="*", default=[100.0], help="ext goodput scheduling's TBT targets"
    )
    parser.add_argument("--window-s", type=float, nargs="+", default=[1.0], help="ext short windows")
    parser.add_argument("--stock-chunk", type=int, nargs="+", default=[8192, 2048], help="stock chunk sizes")
    parser.add_argument("--pass-cost", default=str(PassCost()), help="FIXED_MS,TOKEN_US,PAIR_PS")
    parser.add_argument("--output", type=int, default=32, help="tokens each request generates")
    parser.add_argument("--decode-ms", type=float, default=DECODE_MS, help="one decode step")
    parser.add_argument(
        "--mixed-chunk", action="store_true", help="also each variant with --enable-mixed-chunk"
    )
    args = parser.parse_args(argv)
    harness.require_patched()
    cost = PassCost.parse(args.pass_cost)
    arrivals = mixed(output=args.output)
    variants = [(f"stock, chunk {chunk}", False, chunk, ()) for chunk in args.stock_chunk]
    for budget in args.budget_ms:
        for window in args.window_s:
            extra = (
                *("--prefill-ext-pass-budget-ms", str(budget), "--prefill-ext-short-window-s", str(window)),
                *("--prefill-ext-pass-cost", args.pass_cost),
            )
            variants.append((f"ext, budget {budget:g} ms, window {window:g} s", True, 8192, extra))
    if args.mixed_chunk:
        variants += [(f"{m}, mixed chunk", e, c, (*x, "--enable-mixed-chunk")) for m, e, c, x in variants]
    for target in args.tbt_target_ms:
        extra = ("--prefill-ext-tbt-target-ms", str(target), "--prefill-ext-pass-cost", args.pass_cost)
        variants.append((f"ext goodput, TBT target {target:g} ms", True, 8192, extra))
    results = []
    for mode, ext, chunk, extra in variants:
        config = sr.ReplayConfig(ext=ext, chunked_prefill_size=chunk, overlap=args.overlap, extra_args=extra)
        result = run_timed(arrivals, config, cost, decode_ms=args.decode_ms)
        results.append(dataclasses.replace(result, mode=mode))
    print(
        f"command: python -m bench.replay.mixed_replay {' '.join(argv if argv is not None else sys.argv[1:])}"
    )
    print(
        f"cost model: {cost}, decode step {args.decode_ms:g} ms, {args.output} tokens a request; overlap {args.overlap}\n"
    )
    print(table(results, Targets(alone_cost=cost)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
