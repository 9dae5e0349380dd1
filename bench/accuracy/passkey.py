"""Retrieval through a running SGLang server: does sparse prefill still find a fact planted in real text?

    python -m bench.accuracy.passkey run --url URL --model-dir DIR --length 32768 65536 131072 --label dense \
        --out dense.jsonl [--depths 0.1 0.25 0.5 0.75 0.95] [--keys 2] [--kinds passkey constant]
    python -m bench.accuracy.passkey compare dense.jsonl sparse.jsonl [--json PATH]

`run` plants a random five-digit key (a fixed seed per prompt) in real text (`bench/lib/real_text.py`)
at each depth (fraction of the prompt before it), ends the prompt with the question, and asks the server
for 8 greedy tokens, one prompt at a time after a /flush_cache (the prompts share text, so without it
later ones would hit the radix cache: every prompt is a fresh prefill of its `--length` tokens, its TTFT
that of a unique prompt). Kinds: `passkey` (a sentence naming the pass key), `constant` (a code fact: a
module-level constant `NAME = key` among the source, asked back by name at the end).
`--url transformers:DEVICE` answers the same prompts with transformers on this host (bf16, sdpa) instead
of a server: the check that the server applies the checkpoint's RoPE scaling (YaRN).
An answer is right when the key's digits appear in its decoded text. `compare` reports, per prompt length,
each file's recall (by depth and kind), median TTFT, how many answers equal the first file's, and whether
every later file (sparse) answers every prompt the first (dense) answers (exit 1 if not): the dense model's
own recall is its ceiling, not 100 %, and a length where dense answers under DENSE_FLOOR of its prompts is
reported as not counting (dense fails there), never as a pass.
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

from bench.lib.client import Client, flush_cache
from bench.lib.real_text import corpus_ids
from bench.lib.run_compare import run_and_compare

NEW_TOKENS = 8
NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\nWhat is the pass key? The pass key is"
# (needle, question) per kind, formatted with the key and a constant's name
FACTS = {
    "passkey": (NEEDLE, QUESTION),
    "constant": (
        "\n{name} = {key}  # set once, read by the retry loop below\n",
        "\n\n# Question: what value is the module constant {name} set to above?\n# Answer: {name} =",
    ),
}
DENSE_FLOOR = 0.9  # dense must answer this share of a length's prompts for the length to count


def constant_name(key: str) -> str:
    """A constant's name spelled from its key's digits (fixed per key, unique among keys)."""
    return "RETRY_BUDGET_" + "".join("ABCDEFGHIJ"[int(d)] for d in key)


def build_prompt(
    text_ids: list[int],
    encode: Callable[[str], list[int]],
    length: int,
    depth: float,
    key: str,
    kind: str = "passkey",
) -> list[int]:
    """`length` token ids: real text with the kind's needle after `depth` of it, then its question."""
    needle_text, question_text = FACTS[kind]
    name = constant_name(key)
    needle = encode(needle_text.format(key=key, name=name))
    question = encode(question_text.format(name=name))
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

    text = corpus_ids(tokenizer, max(a.length))
    cases = [
        (length, kind, depth, key)
        for length in a.length
        for kind in a.kinds
        for depth, key in prompt_keys(a.depths, a.keys)
    ]
    prompts = [build_prompt(text, encode, length, depth, key, kind) for length, kind, depth, key in cases]
    if a.url.startswith("transformers:"):
        answers = transformers_answers(a.model_dir, a.url.removeprefix("transformers:"), prompts)
    else:
        answers = asyncio.run(run_prompts(a.url, a.label, prompts))
    right = 0
    with open(a.out, "w") as f:
        for i, ((length, kind, depth, key), (output_ids, ttft_s, error)) in enumerate(
            zip(cases, answers, strict=True)
        ):
            answer = tokenizer.decode(output_ids)
            ok = error is None and key in answer
            right += ok
            row = dict(
                idx=i,
                kind=kind,
                depth=depth,
                key=key,
                length=length,
                answer=answer,
                right=ok,
                ttft_s=ttft_s,
                error=error,
            )
            f.write(json.dumps(row) + "\n")
    print(f"[{a.label}] {'/'.join(a.kinds)} at {a.length} tokens: {right}/{len(cases)} right -> {a.out}")
    return 0


def summarize(rows: list[dict], ref: list[dict]) -> dict[str, object]:
    """One file's rows at one length against the first file's (`ref`, the same prompts)."""
    by_depth: dict[float, list[bool]] = {}
    by_kind: dict[str, list[bool]] = {}
    for row in rows:
        by_depth.setdefault(row["depth"], []).append(row["right"])
        by_kind.setdefault(row.get("kind", "passkey"), []).append(row["right"])
    ttfts = [row["ttft_s"] for row in rows if row.get("ttft_s") is not None]
    return dict(
        recall=sum(row["right"] for row in rows) / len(rows),
        by_depth={d: sum(v) / len(v) for d, v in sorted(by_depth.items())},
        by_kind={k: sum(v) / len(v) for k, v in by_kind.items()},
        missed=[row["idx"] for row, r in zip(rows, ref, strict=True) if r["right"] and not row["right"]],
        same_answers=sum(row["answer"] == r["answer"] for row, r in zip(rows, ref, strict=True)),
        prompts=len(rows),
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
    )


def cmd_compare(a: argparse.Namespace) -> int:
    runs = {path: [json.loads(line) for line in Path(path).read_text().splitlines()] for path in a.files}
    first = a.files[0]
    summary: dict[str, dict[int, dict[str, object]]] = {path: {} for path in a.files}
    failed = False
    for length in sorted({row.get("length") for row in runs[first]}, key=lambda n: n or 0):
        ref = [row for row in runs[first] if row.get("length") == length]
        dense_recall = sum(row["right"] for row in ref) / len(ref)
        counts = dense_recall >= DENSE_FLOOR
        print(
            f"== {length} tokens: dense ({first}) recall {dense_recall:.2f}"
            + ("" if counts else f" < {DENSE_FLOOR}: dense fails at this length, the row does not count")
        )
        for path, all_rows in runs.items():
            rows = [row for row in all_rows if row.get("length") == length]
            s = summarize(rows, ref)
            s["counts"] = counts
            summary[path][length] = s
            failed |= path != first and bool(s["missed"])
            depths = " ".join(f"{d:g}: {v:.2f}" for d, v in s["by_depth"].items())  # type: ignore[union-attr]
            kinds = " ".join(f"{k}: {v:.2f}" for k, v in s["by_kind"].items())  # type: ignore[union-attr]
            ttft = s["ttft_p50_s"]
            note = f", TTFT p50 {ttft:.3f} s" if ttft is not None else ""
            if path != first:
                note += (
                    f"; answers equal to {first}'s: {s['same_answers']}/{s['prompts']}; misses "
                    f"{len(s['missed'])} it answers {s['missed']}"  # type: ignore[arg-type]
                )
                first_ttft = summary[first][length]["ttft_p50_s"]
                if ttft and first_ttft:
                    note += f"; TTFT {first_ttft / ttft:.2f}x lower than {first}"  # type: ignore[operator]
            print(f"{path}: recall {s['recall']:.2f} (depth {depths}; {kinds}){note}")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return 1 if failed else 0


def run_args(run: argparse.ArgumentParser) -> None:
    run.add_argument("--length", type=int, nargs="+", required=True, help="prompt lengths (tokens)")
    run.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.25, 0.5, 0.75, 0.95])
    run.add_argument("--keys", type=int, default=2, help="prompts (distinct keys) per depth and kind")
    run.add_argument("--kinds", nargs="+", choices=sorted(FACTS), default=["passkey"])


def main() -> int:
    return run_and_compare(__doc__, cmd_run, cmd_compare, run_args)


if __name__ == "__main__":
    sys.exit(main())
