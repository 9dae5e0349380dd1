"""The TTFT harness's workloads: each sends its requests through a `Client` and returns what the
summary adds to the client's records (`WORKLOADS`, by name; `list` prints their docstrings).

Prompts are seeded random token ids (`TokenSource`): identical seeds give identical prompts, so a
stock and an ext server see the same requests.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.lib import real_text
from bench.lib.arrivals import mixed_plan, rag_chunks_of, rag_stream_plan
from bench.lib.client import Client, Record

BASELINE_LENGTHS = (1024, 8192, 32768, 100000)
BASELINE_BURSTS = ((32768, 512), (4096, 256))
DEFAULT_WORKLOADS = ("baseline", "burst", "rag", "agent", "unique", "mixed")
# Rough seconds each workload takes on a stock H200 with the 8B-shaped dummy model (baseline: per
# rep); used only to skip workloads that would run past --deadline.
ESTIMATED_S = {
    "baseline": 15,
    "burst": 8,
    "rag": 15,
    "agent": 35,
    "unique": 30,
    "mixed": 12,
    # 200 requests at 12 req/s, cold 16K documents among cache hits: not measured yet
    "rag-stream": 20,
    "pressure": 45,
    # the cache doctor's planted workloads at their defaults: the pass-cost model's prefill time plus
    # 32 decode steps of ~9 ms per request, not measured yet
    "timestamp": 12,
    "shuffled": 15,
    "sysprompt": 6,
    # 200 questions of ~10K tokens at 4 req/s: not measured yet
    "rag-chunks": 60,
}


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
    """(3) 8 sessions x 6 turns; each turn appends the reply and a tool output (~48K at the end); the
    sessions start at once, or as a Poisson process of --agent-session-rate per second."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    system = tok.ids(a.agent_system_tokens, name, "system")
    starts = [0.0] * a.agent_sessions
    if a.agent_session_rate > 0:
        rng = tok.rng(name)
        for s in range(1, a.agent_sessions):
            starts[s] = starts[s - 1] + rng.expovariate(a.agent_session_rate)
    t0 = time.perf_counter()

    async def session(s: int) -> None:
        await asyncio.sleep(starts[s] - (time.perf_counter() - t0))
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
    plan = mixed_plan(
        tok.rng(name),
        a.mixed_long_n,
        a.mixed_long_every_s,
        a.mixed_short_n,
        a.mixed_short_min,
        a.mixed_short_max,
        a.mixed_short_rate,
    )
    t0 = time.perf_counter()
    tasks = []
    for i, at in enumerate(plan.long_s):
        ids = tok.ids(a.mixed_long_tokens, name, "long", i)
        tasks.append(
            _at(
                at,
                c.generate(ids, workload=name, group="long", idx=i, t0=t0, max_new_tokens=a.max_new_tokens),
            )
        )
    for j, (at, n) in enumerate(zip(plan.short_s, plan.short_tokens, strict=True)):
        idx = len(plan.long_s) + j
        tasks.append(
            _at(
                at,
                c.generate(
                    tok.ids(n, name, "short", j),
                    workload=name,
                    group="short",
                    idx=idx,
                    t0=t0,
                    max_new_tokens=a.max_new_tokens,
                ),
            )
        )
    with c.bar(len(tasks), name):
        await asyncio.gather(*tasks)
    return {}


async def wl_rag_stream(ctx: Ctx, name: str) -> dict[str, Any]:
    """(10) RAG where cold documents keep arriving: Zipf popularity over a catalogue that takes a new
    document every few requests, 100-token questions, Poisson arrivals."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    plan = rag_stream_plan(
        tok.rng(name),
        a.rag_stream_requests,
        a.rag_stream_docs,
        a.rag_stream_zipf,
        a.rag_stream_new_every,
        a.rag_stream_rate,
    )
    seen: set[int] = set()
    t0 = time.perf_counter()
    tasks = []
    for i, (at, d) in enumerate(zip(plan.at_s, plan.doc, strict=True)):
        ids = tok.ids(a.rag_doc_tokens, name, "doc", d) + tok.ids(a.rag_question_tokens, name, "q", i)
        reusable = a.rag_doc_tokens if d in seen else 0
        seen.add(d)
        tasks.append(
            _at(
                at,
                c.generate(
                    ids,
                    workload=name,
                    group="hit" if reusable else "cold",
                    idx=i,
                    t0=t0,
                    max_new_tokens=a.max_new_tokens,
                    reusable=reusable,
                ),
            )
        )
    with c.bar(len(tasks), name):
        await asyncio.gather(*tasks)
    return {"arrival_rate_per_s": a.rag_stream_rate, "documents": len(seen)}


def _chunk_stream(ctx: Ctx, name: str, num_tokens: int) -> list[int]:
    """The token stream the rag-chunks catalogue is cut from: the standard library's source
    (`bench.lib.real_text`) through --rag-chunks-tokenizer, else seeded ids like every other workload's."""
    path = ctx.args.rag_chunks_tokenizer
    if not path:
        return ctx.tokens.ids(num_tokens, name, "corpus")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    # source code tokenizes at ~3.5 characters a token; the modules hold ~1M characters
    ids = tokenizer(real_text.corpus_text(num_tokens * 3), add_special_tokens=False)["input_ids"]
    if len(ids) < num_tokens:
        raise SystemExit(
            f"rag-chunks: the standard library gave {len(ids)} tokens, the catalogue needs {num_tokens}; "
            "lower --rag-chunks-catalogue or --rag-chunks-max-tokens"
        )
    return ids


async def wl_rag_chunks(ctx: Ctx, name: str) -> dict[str, Any]:
    """(11) RAG over a catalogue of chunks (issue 40): each question retrieves k of them by Zipf
    popularity, in relevance order, after a shared system prompt, then asks; `chunk_spans` marks the
    chunks (stock SGLang ignores the field). Poisson arrivals."""
    c, tok, a = ctx.client, ctx.tokens, ctx.args
    plan = rag_chunks_of(tok.rng(name), a)
    stream = _chunk_stream(ctx, name, sum(plan.lengths))
    starts = [0, *itertools.accumulate(plan.lengths)]
    chunks = [stream[start : start + n] for start, n in zip(starts, plan.lengths, strict=False)]
    system = tok.ids(a.rag_chunks_system_tokens, name, "system")
    t0 = time.perf_counter()
    tasks = []
    for i, (at, retrieved) in enumerate(zip(plan.at_s, plan.retrieved, strict=True)):
        ids, spans = list(system), []
        for chunk in retrieved:
            spans.append([len(ids), len(ids) + len(chunks[chunk])])
            ids += chunks[chunk]
        ids += tok.ids(a.rag_question_tokens, name, "q", i)
        tasks.append(
            _at(
                at,
                c.generate(
                    ids,
                    workload=name,
                    group="chunks",
                    idx=i,
                    t0=t0,
                    max_new_tokens=a.max_new_tokens,
                    reusable=len(system) if i else 0,
                    extra_body={"chunk_spans": spans},
                ),
            )
        )
    with c.bar(len(tasks), name):
        await asyncio.gather(*tasks)
    sent, seen, in_prefix = plan.reuse()
    return {
        "arrival_rate_per_s": a.rag_chunks_rate,
        "chunk_tokens": sent,
        "chunk_tokens_seen_before": seen,
        "chunk_tokens_in_a_prefix_seen_before": in_prefix,
        "real_text": bool(a.rag_chunks_tokenizer),
    }


async def _one_at_a_time(ctx: Ctx, name: str, prompts: list[list[int]]) -> dict[str, Any]:
    """Send `prompts` in order, each once the one before it answered."""
    c, a = ctx.client, ctx.args
    t0 = time.perf_counter()
    with c.bar(len(prompts), name):
        for i, ids in enumerate(prompts):
            await c.generate(ids, workload=name, group=name, idx=i, t0=t0, max_new_tokens=a.max_new_tokens)
    return {}


async def wl_timestamp(ctx: Ctx, name: str) -> dict[str, Any]:
    """(7) cache doctor, planted: 6-14 tokens that differ per request (a timestamp) in front of a
    shared context and a question; the cache hits none of it."""
    tok, a, rng = ctx.tokens, ctx.args, ctx.tokens.rng(name)
    context = tok.ids(a.doctor_context_tokens, name, "context")
    prompts = [
        tok.ids(rng.randint(6, 14), name, "stamp", i)
        + context
        + tok.ids(a.doctor_question_tokens, name, "q", i)
        for i in range(a.doctor_requests)
    ]
    return await _one_at_a_time(ctx, name, prompts)


async def wl_shuffled(ctx: Ctx, name: str) -> dict[str, Any]:
    """(8) cache doctor, planted: a preamble, the same retrieved documents in a new order for each
    request, a question; the cache hits the preamble and what an earlier order had in front."""
    tok, a, rng = ctx.tokens, ctx.args, ctx.tokens.rng(name)
    preamble = tok.ids(a.doctor_preamble_tokens, name, "preamble")
    docs = [tok.ids(n, name, "doc", d) for d, n in enumerate(a.doctor_doc_tokens)]
    prompts = []
    for i in range(a.doctor_requests):
        order = list(range(len(docs)))
        rng.shuffle(order)
        prompts.append(
            preamble + [t for d in order for t in docs[d]] + tok.ids(a.doctor_question_tokens, name, "q", i)
        )
    return await _one_at_a_time(ctx, name, prompts)


async def wl_sysprompt(ctx: Ctx, name: str) -> dict[str, Any]:
    """(9) cache doctor, planted: a shared system prompt whose line of 40 tokens at a quarter of it
    changes once, halfway through, then a question; the request after the change recomputes the
    system prompt from that line on."""
    tok, a = ctx.tokens, ctx.args
    line_at = a.doctor_context_tokens // 4
    before = tok.ids(line_at, name, "before")
    after = tok.ids(a.doctor_context_tokens - line_at - 40, name, "after")
    prompts = [
        before
        + tok.ids(40, name, "line", i >= a.doctor_requests // 2)
        + after
        + tok.ids(a.doctor_question_tokens, name, "q", i)
        for i in range(a.doctor_requests)
    ]
    return await _one_at_a_time(ctx, name, prompts)


def pressure_names(ratios: list[float]) -> list[str]:
    """One pressure workload per working-set ratio: 'pressure' alone, else 'pressure-<ratio>x'."""
    return ["pressure"] if len(ratios) == 1 else [f"pressure-{r:g}x" for r in ratios]


def workload_kind(name: str) -> str:
    """'pressure-1.5x' -> 'pressure'; other names are their own kind."""
    return "pressure" if name.startswith("pressure-") else name


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
    "rag-stream": wl_rag_stream,
    "pressure": wl_pressure,
    "timestamp": wl_timestamp,
    "shuffled": wl_shuffled,
    "sysprompt": wl_sysprompt,
    "rag-chunks": wl_rag_chunks,
}
