"""Goodput and time between tokens: the targets' math on hand-built requests, the summary's numbers,
and the client timing a real stream (an aiohttp server sending SGLang's /generate events)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from bench.lib.client import Client, Record
from bench.lib.goodput import Targets, judge
from bench.serving.report import render_goodput, summarize_workload
from sglang_prefill_ext.runner.pass_cost import PassCost

TARGETS = Targets()


def test_alone_reference_sums_stock_chunks_over_the_growing_context() -> None:
    cost = PassCost(5.0, 22.0, 890.0)
    targets = Targets(alone_cost=cost, alone_chunk=8192)
    # 20,000 new tokens after 4,000 cached: chunks of 8192, 8192, 3616 over contexts 4000, 12192, 20384
    expected = sum(
        cost.fixed_ms + cost.variable_ms(n, ctx) for n, ctx in ((8192, 4000), (8192, 12192), (3616, 20384))
    )
    assert targets.alone_s(20_000, 4_000) == pytest.approx(expected / 1e3)
    assert targets.ttft_target_s(20_000, 4_000) == pytest.approx(1.5 * expected / 1e3)


def test_short_is_judged_by_uncached_tokens() -> None:
    # 16K cached + 100 new: short, so the fixed 250 ms target, whatever the prompt's length
    assert judge(16_484, 16_384, 0.24, [], TARGETS).met
    assert not judge(16_484, 16_384, 0.26, [], TARGETS).ttft_met
    # the same prompt uncached is long: 1.5 x its alone time
    alone = TARGETS.alone_s(16_484, 0)
    assert judge(16_484, 0, 1.4 * alone, [], TARGETS).met
    assert not judge(16_484, 0, 1.6 * alone, [], TARGETS).met
    assert judge(16_484, 0, 1.6 * alone, [], TARGETS).ttft_over_alone == pytest.approx(1.6)


def test_tbt_target_is_each_requests_p99_gap() -> None:
    steady = [0.02] * 31
    assert judge(1000, 0, 0.1, steady, TARGETS).tbt_met
    # one stall of 400 ms among 31 gaps is the p99 of the request: missed, whatever its mean
    assert not judge(1000, 0, 0.1, [0.02] * 30 + [0.4], TARGETS).tbt_met
    # a single output token has no gap: nothing to miss
    assert judge(1000, 0, 0.1, [], TARGETS).tbt_met


def stream(group: str, prompt: int, cached: int, ttft: float, gaps: list[float], t_send: float) -> Record:
    return Record(
        label="x",
        workload="mixed",
        group=group,
        idx=0,
        prompt_tokens=prompt,
        max_new_tokens=len(gaps) + 1,
        t_send=t_send,
        ttft_s=ttft,
        e2e_s=ttft + sum(gaps),
        cached_tokens=cached,
        output_tokens=len(gaps) + 1,
        tbt_s=gaps,
    )


def mixed_records() -> list[Record]:
    """A long prompt within its target; three shorts: fast, late first token, stalled decode; a failure."""
    long_ttft = 1.2 * TARGETS.alone_s(32768, 0)
    return [
        stream("long", 32768, 0, long_ttft, [0.01] * 3, 0.0),
        stream("short", 1000, 0, 0.1, [0.01] * 3, 0.1),
        stream("short", 1000, 0, 0.5, [0.01] * 3, 0.2),
        stream("short", 1000, 0, 0.1, [0.01, 0.5, 0.01], 0.3),
        failed(stream("short", 1000, 0, 0.1, [], 0.4)),
    ]


def failed(rec: Record) -> Record:
    rec.error, rec.ttft_s, rec.e2e_s = "HTTP 500: boom", None, None
    return rec


def test_summary_counts_goodput_over_the_workloads_wall() -> None:
    s = summarize_workload(mixed_records(), wall_s=4.0, extra={}, targets=TARGETS)
    # met both: the long one and the first short one, of five sent
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    assert s["goodput_req_s"] == pytest.approx(2 / 4.0)
    assert s["ttft_attainment_short"] == pytest.approx(2 / 3)
    assert s["ttft_attainment_long"] == 1.0
    assert s["tbt_attainment"] == pytest.approx(3 / 5)
    assert s["long_ttft_over_alone_p50"] == pytest.approx(1.2)
    assert s["tbt_s"]["max"] == pytest.approx(0.5)
    assert s["tbts"] == sorted([0.01] * 11 + [0.5])
    assert s["ttfts_short"] == pytest.approx([0.1, 0.1, 0.5])
    assert s["groups"]["short"]["goodput_req_s"] == pytest.approx(1 / 4.0)
    assert "tbts" not in s["groups"]["short"]


def test_goodput_table_compares_each_ext_variant_with_the_best_stock_one() -> None:
    def summary(goodput: float, short_p99: float) -> dict:
        return {"workloads": {"mixed": {"goodput_req_s": goodput, "ttft_short_s": {"p99": short_p99}}}}

    md = render_goodput(
        [("stock", summary(1.0, 1.2)), ("stock_mc", summary(2.0, 1.0)), ("ext", summary(5.0, 0.2))]
    )
    assert "| mixed | goodput (req/s) | 1.000 | 2.000 | 5.000 | stock_mc | 2.50 |" in md
    assert "| mixed | short TTFT p99 (s) | 1.200 | 1.000 | 0.200 | stock_mc | 5.00 |" in md


def sse(event: dict) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def serve_then_generate() -> Record:
    """A server streaming 4 tokens the way SGLang's /generate does (each event the whole output so
    far): 1, then 2 more in one event, then 1; the client's record of it."""

    async def generate(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for ids in ([5], [5, 6, 7], [5, 6, 7, 8]):
            meta = {"completion_tokens": len(ids), "prompt_tokens": 3, "cached_tokens": 0}
            await resp.write(sse({"output_ids": ids, "meta_info": meta}))
            await asyncio.sleep(0.01)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with Client(f"http://127.0.0.1:{port}", "x", None, progress=False) as client:
            return await client.generate([1, 2, 3], workload="w", group="g", idx=0, t0=0.0, max_new_tokens=4)
    finally:
        await runner.cleanup()


def test_client_records_a_gap_per_event_that_brought_tokens() -> None:
    rec = asyncio.run(serve_then_generate())
    assert rec.error is None and rec.output_tokens == 4
    assert len(rec.tbt_s) == 2  # the event bringing two tokens is one wait
    assert rec.ttft_s is not None and rec.e2e_s is not None
    assert rec.ttft_s + sum(rec.tbt_s) <= rec.e2e_s
