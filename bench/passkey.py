"""Passkey retrieval through a running SGLang server: does sparse prefill still find a needle in real text?

    python bench/passkey.py run --url URL --model-dir DIR --length 65536 --label dense --out dense.jsonl \
        [--depths 0.05 0.25 0.5 0.75 0.95] [--keys 2]
    python bench/passkey.py compare dense.jsonl sparse.jsonl [--json PATH]

`run` plants a random five-digit pass key (a fixed seed per prompt) in real text (`real_text.py`) at each
depth (fraction of the prompt before it), ends the prompt with the question, and asks the server for 8
greedy tokens, one prompt at a time after a /flush_cache (the prompts share text, so without it later
ones would hit the radix cache: every prompt is a fresh prefill of `--length` tokens, its TTFT that of a
unique prompt). `--url transformers:DEVICE` answers the same prompts with transformers on this host
(bf16, sdpa) instead of a server: the check that the server applies the checkpoint's RoPE scaling (YaRN).
An answer is right when the key's digits appear in its decoded text. `compare` reports each file's recall,
median TTFT, how many answers equal the first file's, and whether every later file (sparse) answers every
prompt the first (dense) answers (exit 1 if not): the dense model's own recall is its ceiling, not 100 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from greedy_check import run_and_compare
from real_text import corpus_ids
from ttft_bench import Client, flush_cache

NEW_TOKENS = 8
NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\nWhat is the pass key? The pass key is"


def build_prompt(
    text_ids: list[int], encode: Callable[[str], list[int]], length: int, depth: float, key: str
) -> list[int]:
    """`length` token ids: real text with the needle after `depth` of it, then the question."""
    needle, question = encode(NEEDLE.format(key=key)), encode(QUESTION)
    body = length - len(needle) - len(question)
    if body <= 0 or len(text_ids) < body:
        raise ValueError(f"passkey: {len(text_ids)} text tokens cannot fill a {length}-token prompt")
    cut = round(body * depth)
    return text_ids[:cut] + needle + text_ids[cut:body] + question


def prompt_keys(depths: list[float], keys: int) -> list[tuple[float, str]]:
    rng = random.Random(0)
    return [(depth, f"{rng.randrange(10_000, 100_000)}") for depth in depths for _ in range(keys)]


async def run_prompts(
    url: str, label: str, prompts: list[list[int]]
) -> list[tuple[list[int], float | None, str | None]]:
    """(output ids, TTFT, error) of each prompt, one at a time, each after a cache flush."""
    async with Client(url, label, None, progress=False) as client:
        done = []
        for i, ids in enumerate(prompts):
            if not await asyncio.to_thread(flush_cache, url):
                raise RuntimeError(f"passkey: POST {url}/flush_cache failed; TTFTs would include cache hits")
            rec = await client.generate(
                ids, workload="passkey", group="passkey", idx=i, t0=0.0, max_new_tokens=NEW_TOKENS
            )
            done.append((rec.output_ids or [], rec.ttft_s, rec.error))
        return done


def transformers_answers(
    model_dir: str, device: str, prompts: list[list[int]]
) -> list[tuple[list[int], None, None]]:
    """The same greedy answers from transformers (bf16, sdpa), no server: the RoPE-scaling reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to(device).eval()
    done = []
    for ids in prompts:
        tokens = torch.tensor([ids], device=device)
        with torch.no_grad():
            out = model.generate(
                tokens,
                attention_mask=torch.ones_like(tokens),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                min_new_tokens=NEW_TOKENS,
            )
        done.append((out[0, len(ids) :].tolist(), None, None))
    return done


def cmd_run(a: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    text = corpus_ids(tokenizer, a.length)
    cases = prompt_keys(a.depths, a.keys)
    prompts = [build_prompt(text, encode, a.length, depth, key) for depth, key in cases]
    if a.url.startswith("transformers:"):
        answers = transformers_answers(a.model_dir, a.url.removeprefix("transformers:"), prompts)
    else:
        answers = asyncio.run(run_prompts(a.url, a.label, prompts))
    right = 0
    with open(a.out, "w") as f:
        for i, ((depth, key), (output_ids, ttft_s, error)) in enumerate(zip(cases, answers, strict=True)):
            answer = tokenizer.decode(output_ids)
            ok = error is None and key in answer
            right += ok
            row = dict(
                idx=i,
                depth=depth,
                key=key,
                length=a.length,
                answer=answer,
                right=ok,
                ttft_s=ttft_s,
                error=error,
            )
            f.write(json.dumps(row) + "\n")
    print(f"[{a.label}] passkey at {a.length} tokens: {right}/{len(cases)} right -> {a.out}")
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    runs = {path: [json.loads(line) for line in Path(path).read_text().splitlines()] for path in a.files}
    first, *others = a.files
    summary: dict[str, object] = {}
    failed = False
    for path, rows in runs.items():
        by_depth: dict[float, list[bool]] = {}
        for row in rows:
            by_depth.setdefault(row["depth"], []).append(row["right"])
        missed = [
            row["idx"]
            for row, ref in zip(rows, runs[first], strict=True)
            if ref["right"] and not row["right"]
        ]
        failed |= path in others and bool(missed)
        recall = sum(row["right"] for row in rows) / len(rows)
        same = sum(row["answer"] == ref["answer"] for row, ref in zip(rows, runs[first], strict=True))
        ttfts = [row["ttft_s"] for row in rows if row.get("ttft_s") is not None]
        ttft = statistics.median(ttfts) if ttfts else None
        summary[path] = dict(
            recall=recall,
            by_depth={d: sum(v) / len(v) for d, v in by_depth.items()},
            missed=missed,
            same_answers=same,
            ttft_p50_s=ttft,
        )
        depths = " ".join(f"{d:g}: {sum(v)}/{len(v)}" for d, v in sorted(by_depth.items()))
        note = f", TTFT p50 {ttft:.3f} s" if ttft is not None else ""
        if path != first:
            note += (
                f"; answers equal to {first}'s: {same}/{len(rows)}; misses {len(missed)} it answers {missed}"
            )
            first_ttft = summary[first]["ttft_p50_s"]  # type: ignore[index]
            if ttft and first_ttft:
                note += f"; TTFT {first_ttft / ttft:.2f}x lower than {first}"
        print(f"{path}: recall {recall:.2f} ({depths}){note}")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return 1 if failed else 0


def run_args(run: argparse.ArgumentParser) -> None:
    run.add_argument("--length", type=int, required=True)
    run.add_argument("--depths", type=float, nargs="+", default=[0.05, 0.25, 0.5, 0.75, 0.95])
    run.add_argument("--keys", type=int, default=2, help="prompts (distinct keys) per depth")


def main() -> int:
    return run_and_compare(__doc__, cmd_run, cmd_compare, run_args)


if __name__ == "__main__":
    sys.exit(main())
