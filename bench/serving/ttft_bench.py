#!/usr/bin/env python3
"""TTFT benchmark client for a running SGLang server (POST /generate with `input_ids`, streamed).

Sub-commands:

  run      send one or more workloads to a server; append one JSON line per request to
           OUT_DIR/requests.jsonl and merge per-workload statistics into OUT_DIR/summary.json
  report   read one or more summaries (e.g. stock and ext) and write a markdown table with
           stock/ext ratios, plus a TTFT CDF PNG when matplotlib is importable
  list     print the workloads and what they send

No tokenizer is needed: prompts are seeded random token ids in [--token-low, --token-high),
which by default stays below Llama-3's special tokens (128000..128255). Identical `--seed` gives
identical prompts, so a stock and an ext server see the same requests.

Needs only the standard library and aiohttp (matplotlib and tqdm are optional).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import random
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

try:  # optional progress bars
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - depends on the host
    _tqdm = None

LLAMA3_VOCAB = 128256
LLAMA3_FIRST_SPECIAL = 128000
BASELINE_LENGTHS = (1024, 8192, 32768, 100000)
BASELINE_BURSTS = ((32768, 512), (4096, 256))
ALL_WORKLOADS = ("baseline", "burst", "rag", "agent", "unique", "mixed", "pressure")
DEFAULT_WORKLOADS = ("baseline", "burst", "rag", "agent", "unique", "mixed")
# Rough seconds each workload takes on a stock H200 with the 8B-shaped dummy model (baseline: per
# rep); used only to skip workloads that would run past --deadline.
ESTIMATED_S = {"baseline": 15, "burst": 8, "rag": 15, "agent": 35, "unique": 30, "mixed": 12, "pressure": 45}


# --------------------------------------------------------------------------------------------
# HTTP helpers (stdlib, for the non-timed calls)


def http_json(url: str, payload: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read().decode()
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return body


def wait_healthy(url: str, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    return False


def flush_cache(url: str) -> bool:
    """Ask the server to drop its radix cache (it only does so while idle); retries briefly."""
    for _ in range(20):
        try:
            req = urllib.request.Request(url + "/flush_cache", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as resp:
                if resp.status == 200:
                    return True
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, OSError):
            return False
        time.sleep(0.25)
    return False


SERVER_INFO_KEYS = (
    "version",
    "model_path",
    "load_format",
    "attention_backend",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_total_num_tokens",
    "mem_fraction_static",
    "page_size",
    "context_length",
    "disable_radix_cache",
    "disable_prefill_cuda_graph",
    "enable_prefill_ext",
    "prefill_ext_options",
    "max_running_requests",
    "schedule_policy",
)


def server_info(url: str) -> dict[str, Any]:
    for path in ("/server_info", "/get_server_info"):
        try:
            info = http_json(url + path)
        except (urllib.error.URLError, OSError):
            continue
        if isinstance(info, dict):
            return {k: info[k] for k in SERVER_INFO_KEYS if k in info}
    return {}


# --------------------------------------------------------------------------------------------
# Prompts


def derive_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


@dataclasses.dataclass
class TokenSource:
    base_seed: int
    low: int
    high: int

    def ids(self, n: int, *key: object) -> list[int]:
        rng = random.Random(derive_seed(self.base_seed, *key))
        return rng.choices(range(self.low, self.high), k=n)

    def rng(self, *key: object) -> random.Random:
        return random.Random(derive_seed(self.base_seed, "rng", *key))


def size_label(n: int) -> str:
    if n % 1024 == 0:
        return f"{n // 1024}K"
    if n % 1000 == 0:
        return f"{n // 1000}K"
    return str(n)


# --------------------------------------------------------------------------------------------
# One streamed request


@dataclasses.dataclass
class Record:
    label: str
    workload: str
    group: str
    idx: int
    prompt_tokens: int
    max_new_tokens: int
    t_send: float  # seconds since the workload started
    ttft_s: float | None = None
    e2e_s: float | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    reusable_tokens: int = 0  # prefix the client knows an earlier request already sent
    server_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    session: int | None = None
    turn: int | None = None
    rep: int | None = None
    output_ids: list[int] | None = dataclasses.field(default=None, repr=False)

    @property
    def t_first(self) -> float | None:
        return None if self.ttft_s is None else self.t_send + self.ttft_s

    @property
    def t_end(self) -> float | None:
        return None if self.e2e_s is None else self.t_send + self.e2e_s

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("output_ids")
        return d


def _completion_tokens(event: dict[str, Any]) -> int:
    meta = event.get("meta_info") or {}
    if "completion_tokens" in meta:
        return int(meta["completion_tokens"])
    return len(event.get("output_ids") or [])


class Client:
    def __init__(self, url: str, label: str, jsonl: Path | None, progress: bool = True):
        self.url = url.rstrip("/")
        self.label = label
        self.jsonl = jsonl
        self.progress = progress and _tqdm is not None
        self.session: Any = None
        self.records: list[Record] = []
        self._bar: Any = None

    async def __aenter__(self) -> Client:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=900)
        self.session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0, force_close=False)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    @contextlib.contextmanager
    def bar(self, total: int, desc: str) -> Iterable[None]:
        if self.progress:
            self._bar = _tqdm(total=total, desc=desc, file=sys.stderr, leave=False, mininterval=1.0)
        try:
            yield
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    async def generate(
        self,
        ids: list[int],
        *,
        workload: str,
        group: str,
        idx: int,
        t0: float,
        max_new_tokens: int,
        reusable: int = 0,
        **tags: Any,
    ) -> Record:
        rec = Record(
            label=self.label,
            workload=workload,
            group=group,
            idx=idx,
            prompt_tokens=len(ids),
            max_new_tokens=max_new_tokens,
            t_send=0.0,
            reusable_tokens=reusable,
            **tags,
        )
        payload = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
            "stream": True,
        }
        body = json.dumps(payload).encode()
        start = time.perf_counter()
        rec.t_send = start - t0
        output_ids: list[int] = []
        last: dict[str, Any] | None = None
        try:
            async with self.session.post(
                self.url + "/generate", data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                else:
                    buf = b""
                    done = False
                    async for chunk in resp.content.iter_any():
                        buf += chunk
                        while b"\n\n" in buf and not done:
                            raw, buf = buf.split(b"\n\n", 1)
                            raw = raw.strip()
                            if not raw.startswith(b"data:"):
                                continue
                            data = raw[5:].strip()
                            if data == b"[DONE]":
                                done = True
                                break
                            event = json.loads(data)
                            if "error" in event:
                                rec.error = str(event["error"])[:500]
                                continue
                            now = time.perf_counter()
                            n_done = _completion_tokens(event)
                            if rec.ttft_s is None and n_done >= 1:
                                rec.ttft_s = now - start
                            new_ids = event.get("output_ids") or []
                            # Incremental streaming sends deltas, the default sends the whole list.
                            if len(new_ids) == n_done:
                                output_ids = list(new_ids)
                            else:
                                output_ids.extend(new_ids)
                            last = event
                        if done:
                            break
        except Exception as e:  # network errors, server death: recorded, not raised
            rec.error = f"{type(e).__name__}: {e}"[:500]
        end = time.perf_counter()
        if last is not None:
            meta = last.get("meta_info") or {}
            rec.cached_tokens = meta.get("cached_tokens")
            rec.output_tokens = _completion_tokens(last)
            rec.server_prompt_tokens = meta.get("prompt_tokens")
            fr = meta.get("finish_reason")
            rec.finish_reason = fr.get("type") if isinstance(fr, dict) else fr
            if rec.error is None:
                rec.e2e_s = end - start
        elif rec.error is None:
            rec.error = "no output event"
        rec.output_ids = output_ids
        self.records.append(rec)
        if self.jsonl is not None:
            with open(self.jsonl, "a") as f:
                f.write(json.dumps(rec.to_json()) + "\n")
        if self._bar is not None:
            self._bar.update(1)
        return rec


# --------------------------------------------------------------------------------------------
# Workloads


@dataclasses.dataclass
class Ctx:
    client: Client
    tokens: TokenSource
    args: argparse.Namespace
    pool_tokens: int | None


WorkloadFn = Callable[[Ctx, str], Awaitable[dict[str, Any]]]


async def _at(delay: float, coro: Awaitable[Record]) -> Record:
    if delay > 0:
        await asyncio.sleep(delay)
    return await coro


async def wl_baseline(ctx: Ctx, name: str) -> dict[str, Any]:
    """Single prompts, first (uncached) then again (cache hit); then the two bursts. max_new_tokens=1."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    extra: dict[str, Any] = {"burst_wall_s": {}}
    idx = 0
    with c.bar(a.baseline_reps * (2 * len(BASELINE_LENGTHS) + 16 * len(BASELINE_BURSTS)), name):
        for rep in range(a.baseline_reps):
            for n in BASELINE_LENGTHS:
                ids = tok.ids(n, name, rep, n)
                for kind in ("first", "hit"):
                    t0 = time.perf_counter()
                    await c.generate(
                        ids,
                        workload=name,
                        group=f"{size_label(n)} {kind}",
                        idx=idx,
                        t0=t0,
                        max_new_tokens=1,
                        reusable=n if kind == "hit" else 0,
                        rep=rep,
                    )
                    idx += 1
            for shared, own in BASELINE_BURSTS:
                group = f"16x({size_label(shared)}+{own}) burst"
                prefix = tok.ids(shared, name, rep, "burst", shared)
                t0 = time.perf_counter()
                recs = await asyncio.gather(
                    *(
                        c.generate(
                            prefix + tok.ids(own, name, rep, "burst", shared, i),
                            workload=name,
                            group=group,
                            idx=idx + i,
                            t0=t0,
                            max_new_tokens=1,
                            rep=rep,
                        )
                        for i in range(16)
                    )
                )
                idx += 16
                ends = [r.t_end for r in recs if r.t_end is not None]
                extra["burst_wall_s"].setdefault(group, []).append(max(ends) if len(ends) == 16 else None)
    return extra


async def wl_burst(ctx: Ctx, name: str) -> dict[str, Any]:
    """(1) 16 concurrent requests sharing an uncached 32K prefix, each with its own 512 tokens."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    walls = []
    with c.bar(a.burst_reps * a.burst_n, name):
        for rep in range(a.burst_reps):
            prefix = tok.ids(a.burst_shared, name, rep, "prefix")
            t0 = time.perf_counter()
            recs = await asyncio.gather(
                *(
                    c.generate(
                        prefix + tok.ids(a.burst_own, name, rep, i),
                        workload=name,
                        group="burst",
                        idx=rep * a.burst_n + i,
                        t0=t0,
                        max_new_tokens=a.max_new_tokens,
                        rep=rep,
                    )
                    for i in range(a.burst_n)
                )
            )
            firsts = [r.t_first for r in recs if r.t_first is not None]
            walls.append(max(firsts) if len(firsts) == len(recs) else None)
    return {"burst_last_first_token_s": walls}


async def wl_rag(ctx: Ctx, name: str) -> dict[str, Any]:
    """(2) 64 requests over 4 shared 16K documents, 100-token questions, Poisson arrivals."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    rng = tok.rng(name)
    docs = [tok.ids(a.rag_doc_tokens, name, "doc", d) for d in range(a.rag_docs)]
    order = [i % a.rag_docs for i in range(a.rag_requests)]
    rng.shuffle(order)
    t, seen, tasks = 0.0, set(), []
    t0 = time.perf_counter()
    for i, d in enumerate(order):
        ids = docs[d] + tok.ids(a.rag_question_tokens, name, "q", i)
        reusable = a.rag_doc_tokens if d in seen else 0
        seen.add(d)
        tasks.append(
            _at(
                t - (time.perf_counter() - t0),
                c.generate(
                    ids,
                    workload=name,
                    group=f"doc{d}",
                    idx=i,
                    t0=t0,
                    max_new_tokens=a.max_new_tokens,
                    reusable=reusable,
                ),
            )
        )
        t += rng.expovariate(a.rag_rate)
    with c.bar(len(tasks), name):
        await asyncio.gather(*tasks)
    return {"arrival_rate_per_s": a.rag_rate}


async def wl_agent(ctx: Ctx, name: str) -> dict[str, Any]:
    """(3) 8 sessions x 6 turns; each turn appends the reply and a tool output (~48K at the end)."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    system = tok.ids(a.agent_system_tokens, name, "system")
    t0 = time.perf_counter()

    async def session(s: int) -> None:
        ctx_ids = system + tok.ids(a.agent_first_tokens - a.agent_system_tokens, name, s, "task")
        reusable = 0
        for turn in range(a.agent_turns):
            rec = await c.generate(
                ctx_ids,
                workload=name,
                group=f"turn{turn + 1}",
                idx=s * a.agent_turns + turn,
                t0=t0,
                max_new_tokens=a.max_new_tokens,
                reusable=reusable,
                session=s,
                turn=turn + 1,
            )
            out = rec.output_ids or tok.ids(a.max_new_tokens, name, s, turn, "reply")
            # SGLang caches prompt + reply minus the reply's last token when a request finishes.
            reusable = len(ctx_ids) + max(0, len(out) - 1)
            ctx_ids = ctx_ids + list(out) + tok.ids(a.agent_tool_tokens, name, s, turn, "tool")
            if a.agent_think_s > 0:
                await asyncio.sleep(a.agent_think_s)

    with c.bar(a.agent_sessions * a.agent_turns, name):
        await asyncio.gather(*(session(s) for s in range(a.agent_sessions)))
    return {}


async def wl_unique(ctx: Ctx, name: str) -> dict[str, Any]:
    """(4) unique long documents, 8K / 32K / 100K, no reuse, one at a time."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    plan = [(n, r) for n, reps in zip(a.unique_lengths, a.unique_reps, strict=True) for r in range(reps)]
    with c.bar(len(plan), name):
        for i, (n, r) in enumerate(plan):
            t0 = time.perf_counter()
            await c.generate(
                tok.ids(n, name, n, r),
                workload=name,
                group=size_label(n),
                idx=i,
                t0=t0,
                max_new_tokens=a.max_new_tokens,
                rep=r,
            )
    return {}


async def wl_mixed(ctx: Ctx, name: str) -> dict[str, Any]:
    """(5) short requests (Poisson) while long unique prompts arrive every few seconds."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    rng = tok.rng(name)
    t0 = time.perf_counter()
    tasks = []
    for i in range(a.mixed_long_n):
        tasks.append(
            _at(
                i * a.mixed_long_every_s,
                c.generate(
                    tok.ids(a.mixed_long_tokens, name, "long", i),
                    workload=name,
                    group="long",
                    idx=i,
                    t0=t0,
                    max_new_tokens=a.max_new_tokens,
                ),
            )
        )
    t = rng.expovariate(a.mixed_short_rate)
    for j in range(a.mixed_short_n):
        n = rng.randint(a.mixed_short_min, a.mixed_short_max)
        tasks.append(
            _at(
                t,
                c.generate(
                    tok.ids(n, name, "short", j),
                    workload=name,
                    group="short",
                    idx=a.mixed_long_n + j,
                    t0=t0,
                    max_new_tokens=a.max_new_tokens,
                ),
            )
        )
        t += rng.expovariate(a.mixed_short_rate)
    with c.bar(len(tasks), name):
        await asyncio.gather(*tasks)
    return {}


def pressure_names(ratios: list[float]) -> list[str]:
    """One pressure workload per working-set ratio: 'pressure' alone, else 'pressure-<ratio>x'."""
    return ["pressure"] if len(ratios) == 1 else [f"pressure-{r:g}x" for r in ratios]


def workload_kind(name: str) -> str:
    """'pressure-1.5x' -> 'pressure'; other names are their own kind."""
    return name.partition("-")[0]


async def wl_pressure(ctx: Ctx, name: str) -> dict[str, Any]:
    """(6) multi-turn sessions, round-robin, whose working set is a multiple of the KV pool
    (--pressure-ratio; several ratios run as pressure-<ratio>x, one after the other)."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    ratio = (
        float(name.removeprefix("pressure-").removesuffix("x")) if name != "pressure" else a.pressure_ratio[0]
    )
    final_len = a.pressure_first_tokens + (a.pressure_turns - 1) * (a.pressure_tool_tokens + a.max_new_tokens)
    pool = ctx.pool_tokens
    if a.pressure_sessions > 0:
        n_sessions = a.pressure_sessions
    elif pool:
        n_sessions = max(2, min(a.pressure_max_sessions, math.ceil(ratio * pool / final_len)))
    else:
        raise RuntimeError("pressure: server did not report max_total_num_tokens; pass --pressure-sessions")
    ctx_ids = [tok.ids(a.pressure_first_tokens, name, s, "first") for s in range(n_sessions)]
    reusable = [0] * n_sessions
    t0 = time.perf_counter()
    idx = 0
    sem = asyncio.Semaphore(a.pressure_concurrency)

    async def one(s: int, turn: int) -> None:
        nonlocal idx
        async with sem:
            i = idx
            idx += 1
            rec = await c.generate(
                ctx_ids[s],
                workload=name,
                group=f"turn{turn + 1}",
                idx=i,
                t0=t0,
                max_new_tokens=a.max_new_tokens,
                reusable=reusable[s],
                session=s,
                turn=turn + 1,
            )
        out = rec.output_ids or tok.ids(a.max_new_tokens, name, s, turn, "reply")
        reusable[s] = len(ctx_ids[s]) + max(0, len(out) - 1)
        ctx_ids[s] = ctx_ids[s] + list(out) + tok.ids(a.pressure_tool_tokens, name, s, turn, "tool")

    with c.bar(n_sessions * a.pressure_turns, name):
        for turn in range(a.pressure_turns):
            await asyncio.gather(*(one(s, turn) for s in range(n_sessions)))
    return {
        "pool_tokens": pool,
        "sessions": n_sessions,
        "final_context_tokens": final_len,
        "working_set_over_pool": (n_sessions * final_len / pool) if pool else None,
    }


WORKLOADS: dict[str, WorkloadFn] = {
    "baseline": wl_baseline,
    "burst": wl_burst,
    "rag": wl_rag,
    "agent": wl_agent,
    "unique": wl_unique,
    "mixed": wl_mixed,
    "pressure": wl_pressure,
}


# --------------------------------------------------------------------------------------------
# Statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def summarize(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.error is None and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    uncached = prompt - cached
    reusable = sum(r.reusable_tokens for r in ok)
    recomputed = sum(max(0, r.reusable_tokens - (r.cached_tokens or 0)) for r in ok)
    first_sends = [r.t_send for r in ok]
    last_first = max((r.t_first for r in ok if r.t_first is not None), default=None)
    prefill_span = (last_first - min(first_sends)) if ok and last_first is not None else None
    per_req_prefill = [
        (r.prompt_tokens - (r.cached_tokens or 0)) / r.ttft_s for r in ok if r.ttft_s and r.ttft_s > 0
    ]
    decode = [
        (r.output_tokens - 1) / (r.e2e_s - r.ttft_s)
        for r in ok
        if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens > 1 and r.e2e_s > r.ttft_s
    ]
    decode_tokens = sum(max(0, r.output_tokens - 1) for r in ok)
    return {
        "n": len(records),
        "errors": len(records) - len(ok),
        "error_samples": [r.error for r in records if r.error][:3],
        "ttft_s": _dist(ttfts),
        "e2e_s": _dist([r.e2e_s for r in ok if r.e2e_s is not None]),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "uncached_tokens": uncached,
        "hit_rate": cached / prompt if prompt else None,
        "reusable_tokens": reusable,
        "reuse_hit_rate": (cached / reusable) if reusable else None,
        "recomputed_tokens": recomputed,
        "prefill_tok_s": uncached / prefill_span if prefill_span else None,
        "prefill_tok_s_per_req_p50": percentile(per_req_prefill, 50),
        "decode_tok_s_per_req_p50": percentile(decode, 50),
        "decode_tok_s_total": decode_tokens / wall_s if wall_s > 0 else None,
        "output_tokens": sum(r.output_tokens for r in ok),
        "wall_s": wall_s,
        "ttfts": sorted(ttfts),
    }


def summarize_workload(records: Sequence[Record], wall_s: float, extra: dict[str, Any]) -> dict[str, Any]:
    out = summarize(records, wall_s)
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(r.group, []).append(r)
    out["groups"] = {}
    for g, recs in groups.items():
        s = summarize(recs, wall_s)
        s.pop("ttfts")
        s["ttft_values"] = [r.ttft_s for r in recs]
        s["cached_values"] = [r.cached_tokens for r in recs]
        out["groups"][g] = s
    out.update(extra)
    return out


# --------------------------------------------------------------------------------------------
# run


def _load_summary(path: Path) -> dict[str, Any]:
    if path.exists():
        with open(path) as f:
            return json.load(f)
    return {}


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
    summary = _load_summary(summary_path)
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
            ws = summarize_workload(client.records, wall, extra)
            summary["workloads"][w] = ws
            summary["servers"][w] = info
            with open(summary_path, "w") as f:
                json.dump(summary, f, indent=1)
            t = ws["ttft_s"]
            print(
                f"[{a.label}] {w}: n={ws['n']} err={ws['errors']} wall={wall:.1f}s "
                f"ttft p50={_fmt(t['p50'])} p99={_fmt(t['p99'])} hit={_fmt(ws['hit_rate'], 3)} "
                f"prefill={_fmt(ws['prefill_tok_s'], 0)} tok/s",
                flush=True,
            )
            if ws["errors"]:
                print(f"  errors: {ws['error_samples']}", flush=True)
                rc = 1
    return rc


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


# --------------------------------------------------------------------------------------------
# report / compare

# (key path, label, digits)
METRICS: tuple[tuple[tuple[str, ...], str, int], ...] = (
    (("ttft_s", "p50"), "TTFT p50 (s)", 3),
    (("ttft_s", "p95"), "TTFT p95 (s)", 3),
    (("ttft_s", "p99"), "TTFT p99 (s)", 3),
    (("e2e_s", "p50"), "e2e p50 (s)", 3),
    (("prefill_tok_s",), "prefill tok/s (uncached / span to last first token)", 0),
    (("prefill_tok_s_per_req_p50",), "prefill tok/s per request (p50)", 0),
    (("hit_rate",), "hit rate (cached / prompt tokens)", 3),
    (("reuse_hit_rate",), "cached / reusable tokens", 3),
    (("recomputed_tokens",), "recomputed tokens (reusable, not cached)", 0),
    (("decode_tok_s_per_req_p50",), "decode tok/s per request (p50)", 0),
    (("errors",), "errors", 0),
)


def _get(d: dict[str, Any], path: Sequence[str]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _ratio(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{a / b:.2f}"
    return "-"


def _median(xs: Iterable[Any]) -> float | None:
    vals = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(vals) if vals else None


def baseline_rows(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """group -> {median, min, max, n} of TTFT (single prompts) or of the burst's wall time."""
    wl = _get(summary, ("workloads", "baseline")) or {}
    rows: dict[str, dict[str, Any]] = {}
    for g, s in (wl.get("groups") or {}).items():
        if "burst" in g:
            vals = [v for v in (wl.get("burst_wall_s") or {}).get(g, []) if v is not None]
        else:
            vals = [v for v in s.get("ttft_values", []) if v is not None]
        rows[g] = {
            "median": _median(vals),
            "min": min(vals) if vals else None,
            "max": max(vals) if vals else None,
            "n": len(vals),
            "cached": _median(s.get("cached_values", [])),
            "errors": s.get("errors", 0),
        }
    return rows


def render_report(summaries: list[tuple[str, dict[str, Any]]], reference: dict[str, Any] | None) -> str:
    labels = [lab for lab, _ in summaries]
    lines: list[str] = []
    pair = len(summaries) == 2
    ratio_head = f" {labels[0]}/{labels[1]} |" if pair else ""
    ratio_rule = " ---: |" if pair else ""

    # Baseline: single prompts and the bursts
    base = [(lab, baseline_rows(s)) for lab, s in summaries]
    groups: list[str] = []
    for _, rows in base:
        groups += [g for g in rows if g not in groups]
    if groups:
        ref = (reference or {}).get("rows", {})
        lines.append("### Baseline (max_new_tokens=1; median of reps, [min–max]; bursts: wall to last token)")
        lines.append("")
        head = "| request |" + (" recorded |" if ref else "") + "".join(f" {lab} (s) |" for lab in labels)
        head += ratio_head + " cached (median) |"
        lines.append(head)
        lines.append(
            "| --- |" + (" ---: |" if ref else "") + " ---: |" * len(labels) + ratio_rule + " ---: |"
        )
        for g in groups:
            cells = [f"| {g} |"]
            if ref:
                cells.append(f" {_fmt(ref.get(g), 3)} |")
            meds = []
            for _, rows in base:
                r = rows.get(g)
                meds.append(r["median"] if r else None)
                cells.append(
                    f" {_fmt(r['median'])} [{_fmt(r['min'])}–{_fmt(r['max'])}] (n={r['n']}) |"
                    if r
                    else " - |"
                )
            if pair:
                cells.append(f" {_ratio(meds[0], meds[1])} |")
            cached = [rows[g]["cached"] for _, rows in base if g in rows]
            cells.append(f" {' / '.join('-' if c is None else f'{c:,.0f}' for c in cached)} |")
            lines.append("".join(cells))
        lines.append("")

    names: list[str] = []
    for _, s in summaries:
        names += [w for w in (s.get("workloads") or {}) if w != "baseline" and w not in names]
    for w in names:
        lines.append(f"### {w}")
        lines.append("")
        notes = []
        for lab, s in summaries:
            ws = _get(s, ("workloads", w)) or {}
            if "skipped" in ws or "failed" in ws:
                notes.append(f"{lab}: {ws.get('skipped') or ws.get('failed')}")
            for k in ("sessions", "pool_tokens", "working_set_over_pool", "arrival_rate_per_s"):
                if k in ws:
                    notes.append(f"{lab}: {k}={_fmt(ws[k], 2)}")
        if notes:
            lines.append("; ".join(notes))
            lines.append("")
        lines.append("| metric |" + "".join(f" {lab} |" for lab in labels) + ratio_head)
        lines.append("| --- |" + " ---: |" * len(labels) + ratio_rule)
        for path, title, digits in METRICS:
            vals = [_get(s, ("workloads", w, *path)) for _, s in summaries]
            if all(v is None for v in vals):
                continue
            row = f"| {title} |" + "".join(f" {_fmt(v, digits)} |" for v in vals)
            if pair:
                row += f" {_ratio(vals[0], vals[1])} |"
            lines.append(row)
        # per-group TTFT p50 for workloads whose groups mean something (turns, lengths, short/long)
        gnames: list[str] = []
        for _, s in summaries:
            gnames += [g for g in (_get(s, ("workloads", w, "groups")) or {}) if g not in gnames]
        if 1 < len(gnames) <= 8 and not all(g.startswith("doc") for g in gnames):
            for g in gnames:
                for q in ("p50", "p99"):
                    vals = [_get(s, ("workloads", w, "groups", g, "ttft_s", q)) for _, s in summaries]
                    row = f"| TTFT {q} {g} (s) |" + "".join(f" {_fmt(v)} |" for v in vals)
                    if pair:
                        row += f" {_ratio(vals[0], vals[1])} |"
                    lines.append(row)
        lines.append("")
    if pair:
        lines.append(
            f"Ratios are {labels[0]}/{labels[1]}: for times above 1 means {labels[1]} is faster; "
            f"for tok/s and hit rate below 1 means {labels[1]} is better."
        )
    return "\n".join(lines) + "\n"


def plot_cdf(summaries: list[tuple[str, dict[str, Any]]], png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        print("matplotlib is not importable: no CDF plot", file=sys.stderr)
        return False

    def ttfts(s: dict[str, Any], name: str) -> list[float]:
        """A workload's sorted TTFTs; `mixed/short`: its short requests' alone."""
        workload, _, group = name.partition("/")
        if group:
            values = _get(s, ("workloads", workload, "groups", group, "ttft_values")) or []
            return sorted(v for v in values if v is not None)
        return _get(s, ("workloads", workload, "ttfts")) or []

    names: list[str] = []
    for _, s in summaries:
        names += [w for w, ws in (s.get("workloads") or {}).items() if ws.get("ttfts") and w not in names]
        if ttfts(s, "mixed/short") and "mixed/short" not in names:
            names.append("mixed/short")
    if not names:
        return False
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, w in zip(axes.flat, names, strict=False):
        for lab, s in summaries:
            xs = ttfts(s, w)
            if xs:
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step(xs, ys, where="post", label=f"{lab} (n={len(xs)})")
        vals = [x for _, s in summaries for x in ttfts(s, w) if x > 0]
        if vals and max(vals) / min(vals) > 20:  # log only where it spans decades
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(w)
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def report(a: argparse.Namespace) -> int:
    summaries = []
    for spec in a.summaries:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        s = _load_summary(Path(path))
        if not s:
            print(f"{path}: missing or empty, left out", file=sys.stderr)
            continue
        summaries.append((label or s.get("label") or Path(path).stem, s))
    if not summaries:
        return 2
    reference = _load_summary(Path(a.reference)) if a.reference else None
    md = render_report(summaries, reference)
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md)
    if a.out_png:
        plot_cdf(summaries, Path(a.out_png))
    return 0


# --------------------------------------------------------------------------------------------
# CLI


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="send workloads to a running server")
    r.add_argument("--url", default="http://127.0.0.1:30000")
    r.add_argument("--label", default="stock", help="variant name stored with every record (stock, ext, ...)")
    r.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"comma-separated, from: {', '.join(ALL_WORKLOADS)}",
    )
    r.add_argument("--out-dir", required=True)
    r.add_argument("--seed", type=int, default=20261129)
    r.add_argument("--token-low", type=int, default=1000)
    r.add_argument(
        "--token-high",
        type=int,
        default=LLAMA3_FIRST_SPECIAL,
        help="exclusive; keep below the first special id and the vocab size (Llama-3: 128000)",
    )
    r.add_argument("--max-new-tokens", type=int, default=32, help="all workloads but baseline (1)")
    r.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="unix time; workloads estimated to end past it are skipped",
    )
    r.add_argument("--health-timeout", type=float, default=600.0)
    r.add_argument("--no-warmup", dest="warmup", action="store_false")
    r.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache before each workload")
    r.add_argument("--no-progress", action="store_true")
    g = r.add_argument_group("workload shapes (defaults follow issue 4)")
    g.add_argument("--baseline-reps", type=int, default=3)
    g.add_argument("--burst-n", type=int, default=16)
    g.add_argument("--burst-shared", type=int, default=32768)
    g.add_argument("--burst-own", type=int, default=512)
    g.add_argument("--burst-reps", type=int, default=3)
    g.add_argument("--rag-docs", type=int, default=4)
    g.add_argument("--rag-doc-tokens", type=int, default=16384)
    g.add_argument("--rag-requests", type=int, default=64)
    g.add_argument("--rag-question-tokens", type=int, default=100)
    g.add_argument("--rag-rate", type=float, default=8.0, help="Poisson arrivals per second")
    g.add_argument("--agent-sessions", type=int, default=8)
    g.add_argument("--agent-turns", type=int, default=6)
    g.add_argument("--agent-system-tokens", type=int, default=2048, help="shared by all sessions")
    g.add_argument("--agent-first-tokens", type=int, default=8192, help="turn-1 prompt, system included")
    g.add_argument("--agent-tool-tokens", type=int, default=8000, help="appended after each reply")
    g.add_argument("--agent-think-s", type=float, default=0.0)
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

    for verb in ("report", "compare"):
        rp = sub.add_parser(verb, help="markdown table + CDF PNG; two summaries give ratios")
        rp.add_argument("summaries", nargs="+", help="[LABEL=]summary.json; give stock first, then ext")
        rp.add_argument("--reference", help="JSON of recorded baseline rows to show alongside")
        rp.add_argument("--out-md")
        rp.add_argument("--out-png")

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
