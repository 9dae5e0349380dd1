#!/usr/bin/env python3
"""What chunk blending's serving plan can gain on `rag-chunks`, on the pass-cost clock: a bound before the GPU.

Each question of the `rag-chunks` plan (`bench.lib.arrivals.rag_chunks_plan`, the bench's defaults) is priced
alone on an idle server, on `PassCost`'s clock (a fixed cost per forward pass, a cost per new token, one per
(new token, context token) pair):

- **stock**: the prefix tree reuses the system prompt and the chunk sequence up to its first chunk no earlier
  question had at that place; the rest is prefilled in chunks of `--chunk` tokens, a pass each;
- **blend, k + 1 passes** (what serving runs where one pass cannot: a prompt over the chunk budget, a
  backend not listed in docs/BLEND.md "Serving"): `blend.plan` over a store that holds every chunk seen
  before, its computed runs one pass each (re-rotation and copies not priced);
- **blend, one pass** (what serving runs when SGLang admits the whole prompt past its match at once,
  docs/BLEND.md): the same computed tokens in one pass (chunked alike), each attending to every position
  before it. Serving charges the chunk budget a blended request's computed tokens; where they exceed what
  is left of it, it serves the k + 1 passes where the replay chunks one pass.

The plan's shape comes from the bench's own `--rag-chunks-*` flags and defaults (`bench.lib.arrivals`). Prints TTFT p50 and the p50 of stock / blend per question, per clock (`--clocks`, `FIXED_MS,TOKEN_US,PAIR_PS`),
so the fixed cost per pass, which the k + 1 passes pay k + 1 times, shows where the 2.5x target can be met.

    python -m bench.replay.blend_replay [--ratio 0.15] [--clocks 10.989,19.769,916.6 ...]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
from collections.abc import Iterator

from bench.lib.arrivals import QUESTION_TOKENS, RagChunksPlan, add_rag_chunks_args, rag_chunks_of
from sglang_prefill_ext.blend import plan as blend_plan
from sglang_prefill_ext.blend.spans import Span
from sglang_prefill_ext.runner.pass_cost import PassCost

# the H200 refit (8B shape, 2026-12-04-capacity-replay-cpu.md); the same clock at Qwen2.5-Coder-1.5B's weights
# and attention (token cost x 1.54 / 8.03 B parameters, pair cost x (28 x 12) / (32 x 32) query heads x layers)
# with the fixed cost kept, then lowered
CLOCKS = ("10.989,19.769,916.6", "10.989,3.79,300.8", "5,3.79,300.8", "2,3.79,300.8")


def prompts(plan: RagChunksPlan, system: int, question: int) -> Iterator[tuple[int, int, tuple[Span, ...]]]:
    """Per question: its prompt length, the stock tree's match (system prompt, then the chunk sequence up to
    its first chunk no earlier question had there: `RagChunksPlan.prefix_depths`), and its chunk spans."""
    for i, (chunks, depth) in enumerate(zip(plan.retrieved, plan.prefix_depths(), strict=True)):
        ends = list(itertools.accumulate((plan.lengths[c] for c in chunks), initial=system))
        spans = tuple(zip(ends, ends[1:], strict=False))
        yield ends[-1] + question, ends[depth] if i else 0, spans


def chunked_ms(clock: PassCost, runs: list[tuple[int, int]], chunk: int) -> float:
    """Computed runs [start, end) in one stream of passes of at most `chunk` new tokens each."""
    ms, in_pass = 0.0, 0
    for start, end in runs:
        pos = start
        while pos < end:
            if in_pass == 0:
                ms += clock.fixed_ms
            take = min(end - pos, chunk - in_pass)
            ms += clock.variable_ms(take, pos)
            pos, in_pass = pos + take, (in_pass + take) % chunk
    return ms


def replay(
    plan: RagChunksPlan, clock: PassCost, ratio: float, system: int, question: int, chunk: int
) -> list[dict]:
    """Per question: stock's, k + 1 passes' and one pass's TTFT in ms, and the blend's recomputed share."""
    seen: dict[int, int] = {}  # chunk -> the position it was stored at
    rows = []
    for chunks, (prompt_len, matched, spans) in zip(
        plan.retrieved, prompts(plan, system, question), strict=True
    ):
        stock = chunked_ms(clock, [(matched, prompt_len)], chunk)
        asked = blend_plan.lookups(spans, matched, page_size=1)
        hits = {lk.index: seen[chunks[lk.index]] for lk in asked if chunks[lk.index] in seen}
        bp = blend_plan.plan(prompt_len, matched, spans, asked, hits, ratio)
        computed = [(run.start, run.end) for run in bp.extends]
        k_passes = sum(chunked_ms(clock, [run], chunk) for run in computed)
        one_pass = chunked_ms(clock, computed, chunk)
        counts = bp.counts(spans)
        for lk in asked:
            seen.setdefault(chunks[lk.index], spans[lk.index][0])
        rows.append(
            dict(
                stock=stock, k_passes=k_passes, one_pass=one_pass, passes=len(computed),
                hits=counts.hits, recomputed=counts.recomputed_tokens,
                reused=counts.reused_tokens,
            )
        )  # fmt: skip
    return rows


def summary(rows: list[dict], warm: int) -> dict[str, float]:
    """p50s over the questions from `warm` on (the store filled by those before)."""
    rest = rows[warm:]
    recomputed = sum(r["recomputed"] for r in rest)
    reused = sum(r["reused"] for r in rest)
    return dict(
        stock=statistics.median(r["stock"] for r in rest),
        k_passes=statistics.median(r["k_passes"] for r in rest),
        one_pass=statistics.median(r["one_pass"] for r in rest),
        ratio_k=statistics.median(r["stock"] / r["k_passes"] for r in rest),
        ratio_one=statistics.median(r["stock"] / r["one_pass"] for r in rest),
        passes=statistics.median(r["passes"] for r in rest),
        recomputed_share=recomputed / max(1, recomputed + reused),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratio", type=float, default=0.15, help="--prefill-ext-blend-recompute-ratio")
    p.add_argument("--clocks", nargs="+", default=list(CLOCKS), help="FIXED_MS,TOKEN_US,PAIR_PS each")
    add_rag_chunks_args(p)  # the rag-chunks shape: the bench's own flags and defaults
    p.add_argument("--rag-question-tokens", type=int, default=QUESTION_TOKENS)
    p.add_argument("--chunk", type=int, default=8192, help="--chunked-prefill-size")
    p.add_argument("--warm", type=int, default=50, help="questions before the p50s (filling the store)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    plan = rag_chunks_of(random.Random(a.seed), a)
    print("| clock (fixed ms, token us, pair ps) | stock p50 ms | k + 1 passes p50 ms | one pass p50 ms "
          "| stock / k + 1 (p50) | stock / one pass (p50) | passes (p50) | recomputed share |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for text in a.clocks:
        s = summary(
            replay(
                plan,
                PassCost.parse(text),
                a.ratio,
                a.rag_chunks_system_tokens,
                a.rag_question_tokens,
                a.chunk,
            ),
            a.warm,
        )
        print(
            f"| {text} | {s['stock']:.1f} | {s['k_passes']:.1f} | {s['one_pass']:.1f} | {s['ratio_k']:.2f}x "
            f"| {s['ratio_one']:.2f}x | {s['passes']:.0f} | {s['recomputed_share']:.3f} |"
        )


if __name__ == "__main__":
    main()
