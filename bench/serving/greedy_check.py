"""Greedy outputs of a real model through a running SGLang server, and their comparison across servers.

    python -m bench.serving.greedy_check run --url URL --model-dir DIR --label off --out off.jsonl
    python -m bench.serving.greedy_check compare off.jsonl ext.jsonl stock.jsonl [--json PATH]

`run` sends 50 prompts of real text (`real_text.py`, tokenized with the model's tokenizer) as
input_ids, greedy, 32 new tokens each (ignore_eos), in four phases that exercise the prefix cache,
chunked prefill and concurrency:
  distinct  20 prompts of 40 to 6,000 tokens, one after another (start the server with a small
            --chunked-prefill-size, e.g. 1024, so the long ones are chunked)
  hits      10 of those prompts again (whole-prompt cache hits)
  partial   10 prompts: one 3,000-token document + a distinct 60-token question (partial hits)
  burst     10 prompts sent at once: an uncached 2,500-token prefix + a distinct 100-token suffix
`compare` checks that every prompt's output ids are identical in every file (exit 1 if not) and prints,
per phase, how many agree, with the first differing position of each disagreement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from bench.lib.client import Client
from bench.lib.real_text import corpus_ids
from bench.lib.run_compare import run_and_compare

NEW_TOKENS = 32
DISTINCT_LENS = (40, 90, 150, 300, 500, 800, 1000, 1023, 1024, 1025, 1500, 2000, 2048, 2500, 3000, 3500,
                 4000, 4500, 5000, 6000)  # fmt: skip


def build_prompts(ids: list[int]) -> list[tuple[str, list[int]]]:
    """(phase, input_ids) for the 50 prompts, cut from one token stream at fixed offsets."""
    prompts: list[tuple[str, list[int]]] = []
    offset = 0
    for n in DISTINCT_LENS:
        prompts.append(("distinct", ids[offset : offset + n]))
        offset += 997
    prompts += [("hits", list(p)) for _, p in prompts[::2]]
    doc_start = 30_000
    doc = ids[doc_start : doc_start + 3000]
    for i in range(10):
        q = doc_start + 3000 + 60 * i
        prompts.append(("partial", doc + ids[q : q + 60]))
    prefix_start = 40_000
    prefix = ids[prefix_start : prefix_start + 2500]
    for i in range(10):
        s = prefix_start + 2500 + 100 * i
        prompts.append(("burst", prefix + ids[s : s + 100]))
    return prompts


async def run_prompts(url: str, label: str, prompts: list[tuple[str, list[int]]], out: Path) -> int:
    out.unlink(missing_ok=True)
    async with Client(url, label, None, progress=False) as client:
        records = []
        for phase in ("distinct", "hits", "partial"):
            for i, (p, ids) in enumerate(prompts):
                if p == phase:
                    records.append(
                        (
                            i,
                            p,
                            await client.generate(
                                ids, workload=p, group=p, idx=i, t0=0.0, max_new_tokens=NEW_TOKENS
                            ),
                        )
                    )
        burst = [(i, ids) for i, (p, ids) in enumerate(prompts) if p == "burst"]
        done = await asyncio.gather(
            *(
                client.generate(
                    ids, workload="burst", group="burst", idx=i, t0=0.0, max_new_tokens=NEW_TOKENS
                )
                for i, ids in burst
            )
        )
        records += [(i, "burst", rec) for (i, _), rec in zip(burst, done, strict=True)]
    errors = 0
    with open(out, "w") as f:
        for i, phase, rec in sorted(records, key=lambda r: r[0]):
            errors += rec.error is not None
            f.write(
                json.dumps(
                    dict(
                        idx=i,
                        phase=phase,
                        prompt_tokens=rec.prompt_tokens,
                        cached_tokens=rec.cached_tokens,
                        output_ids=rec.output_ids,
                        error=rec.error,
                    )
                )
                + "\n"
            )
    print(f"[{label}] {len(records)} prompts, {errors} errors -> {out}")
    return 1 if errors else 0


def cmd_run(a: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)
    prompts = build_prompts(corpus_ids(tokenizer, 50_000))
    return asyncio.run(run_prompts(a.url, a.label, prompts, Path(a.out)))


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def cmd_compare(a: argparse.Namespace) -> int:
    runs = {Path(p).stem: [json.loads(line) for line in Path(p).read_text().splitlines()] for p in a.files}
    names = list(runs)
    ref = runs[names[0]]
    per_phase: dict[str, list[int]] = {}
    mismatches = []
    for j, row in enumerate(ref):
        same = all(
            runs[n][j]["output_ids"] == row["output_ids"]
            and not runs[n][j]["error"]
            and len(row["output_ids"]) == NEW_TOKENS
            for n in names
        )
        counts = per_phase.setdefault(row["phase"], [0, 0])
        counts[0] += same
        counts[1] += 1
        if not same:
            diffs = {n: _first_diff(row["output_ids"], runs[n][j]["output_ids"]) for n in names[1:]}
            mismatches.append(
                dict(
                    idx=row["idx"],
                    phase=row["phase"],
                    first_diff=diffs,
                    errors={n: runs[n][j]["error"] for n in names if runs[n][j]["error"]},
                )
            )
    total = sum(c[0] for c in per_phase.values())
    print(f"greedy outputs ({NEW_TOKENS} tokens) identical across {', '.join(names)}: {total}/{len(ref)}")
    for phase, (same, n) in per_phase.items():
        cached = {
            name: sum(r["cached_tokens"] or 0 for r in runs[name] if r["phase"] == phase) for name in names
        }
        print(f"  {phase}: {same}/{n} identical; cached tokens {cached}")
    for m in mismatches:
        print(
            f"  differs: prompt {m['idx']} ({m['phase']}), first differing output position {m['first_diff']} {m['errors'] or ''}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                dict(
                    files=names, identical=total, prompts=len(ref), per_phase=per_phase, mismatches=mismatches
                ),
                indent=1,
            )
        )
    return 0 if total == len(ref) else 1


def main() -> int:
    return run_and_compare(__doc__, cmd_run, cmd_compare, lambda run: None)


if __name__ == "__main__":
    sys.exit(main())
