"""RULER-style retrieval through running SGLang servers: does sparse prefill answer what dense answers?

    python -m bench.accuracy.ruler run --url URL --model-dir DIR --label dense --out dense.jsonl \
        [--split dev|heldout] [--lengths 32768 65536 102400 130000] [--prompts 40] [--first 0]
    python -m bench.accuracy.ruler compare dense.jsonl sparse.jsonl [more.jsonl ...] [--json PATH] [--md PATH]

`run` builds, per length, `--prompts` cases of the split (`corpora.SPLITS`: dev = standard-library source,
held-out = the sglang package's source and English prose, other seeds), each a haystack of real text carrying
the needles of every task family (`tasks.py`), and asks each of its questions as its own request, greedy.
Per case: a cache flush, then one cold request (the families take turns, or `--cold FAMILY`; its TTFT is
the prompt's prefill), then the other questions at once, which hit the radix cache for the shared haystack and
extend it by their question alone. `--url` is any server: stock and the extension get the same prompts.

`compare` pairs the first file (dense) with each later one per (family, length): dense's and the other's
scores, items lost and gained against dense, McNemar's exact p, and the net share of dense's right answers kept
((right - lost + gained) / right); a cell where dense scores under DENSE_FLOOR is shown and does not count.
Then, per length, dense-right items in counting cells, the cold requests' lost/gained (the path a single
request takes) and the cold TTFT p50 with its ratio. Exit 1 when a counting cell keeps under KEEP of dense's
answers or has p < ALPHA.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.accuracy import corpora, tasks
from bench.lib.client import Client, flush_cache
from bench.lib.run_compare import run_and_compare
from bench.lib.stats import Paired

DENSE_FLOOR = 0.5  # a (family, length) cell counts when dense answers at least this share of it
KEEP = 0.99  # a counting cell passes when the other run answers this share of dense's (net of gained)
ALPHA = 0.05  # ... and McNemar's p is at least this
LENGTHS = (32768, 65536, 102400, 130000)


def prompt_sha(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def ends_line_fn(tokenizer: Any) -> Callable[[int], bool]:
    """Whether a token's text ends a line, for every id of the tokenizer's vocabulary."""
    ends = {i for i in range(len(tokenizer)) if tokenizer.decode([i]).endswith("\n")}
    return ends.__contains__


def cases_of(
    split: str, lengths: list[int], count: int, first: int, tokenizer: Any
) -> list[tuple[dict[str, Any], tasks.Case]]:
    """(row fields, case) per length and prompt of the split, prompts `first` .. `first + count - 1`."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ends_line = ends_line_fn(tokenizer)
    streams: dict[str, tuple[list[int], str]] = {}  # corpus -> (token ids, their fingerprint), made once
    out = []
    for length in lengths:
        for index, (corpus, seed) in enumerate(corpora.split_prompts(split, first + count)):
            if index < first:
                continue
            if corpus not in streams:
                ids = corpora.corpus_ids(corpus, encode, 2 * max(lengths))
                streams[corpus] = ids, corpora.fingerprint(ids)
            ids, fingerprint = streams[corpus]
            rng = random.Random(f"{seed}:{length}")
            offset = rng.randrange(len(ids) - length)
            case = tasks.build_case(ids[offset:], encode, tokenizer.decode, ends_line, length, rng)
            fields = dict(
                split=split,
                corpus=corpus,
                fingerprint=fingerprint,
                seed=seed,
                index=index,
                length=length,
            )
            out.append((fields, case))
    return out


async def ask_case(client: Client, url: str, case: tasks.Case, cold: int) -> list[Any]:
    """Flush, the `cold` question alone, then the others at once: their records in question order."""
    if not await asyncio.to_thread(flush_cache, url):
        raise RuntimeError(f"ruler: POST {url}/flush_cache failed; the cold request would hit the cache")

    def ask(i: int) -> Any:
        q = case.questions[i]
        return client.generate(
            case.prompts[i], workload="ruler", group=q.family, idx=i, t0=0.0, max_new_tokens=q.max_new_tokens
        )

    records: list[Any] = [None] * len(case.questions)
    records[cold] = await ask(cold)
    warm = [i for i in range(len(case.questions)) if i != cold]
    for i, rec in zip(warm, await asyncio.gather(*(ask(i) for i in warm)), strict=True):
        records[i] = rec
    return records


async def run_cases(
    url: str, label: str, cases: list[tuple[dict[str, Any], tasks.Case]], out: Path, decode, cold_family: str
):
    right = total = 0
    async with Client(url, label, None, progress=False) as client:
        with open(out, "w") as f:
            for fields, case in cases:
                cold = (
                    fields["index"] % len(case.questions)
                    if cold_family == "rotate"
                    else next(i for i, q in enumerate(case.questions) if q.family == cold_family)
                )
                records = await ask_case(client, url, case, cold)
                for i, (q, rec) in enumerate(zip(case.questions, records, strict=True)):
                    answer = decode(rec.output_ids or [])
                    ok = rec.error is None and tasks.score(q, answer)
                    right += ok
                    total += 1
                    row = dict(
                        fields,
                        label=label,
                        family=q.family,
                        ask=q.ask,
                        cold=i == cold,
                        prompt_tokens=len(case.prompts[i]),
                        prompt_sha=prompt_sha(case.prompts[i]),
                        answers=list(q.answers),
                        answer=answer,
                        right=ok,
                        ttft_s=rec.ttft_s if i == cold else None,
                        cached_tokens=rec.cached_tokens,
                        error=rec.error,
                    )
                    f.write(json.dumps(row) + "\n")
                f.flush()
    return right, total


def cmd_run(a: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)
    cases = cases_of(a.split, a.lengths, a.prompts, a.first, tokenizer)
    right, total = asyncio.run(run_cases(a.url, a.label, cases, Path(a.out), tokenizer.decode, a.cold))
    print(f"[{a.label}] {a.split} at {a.lengths}: {right}/{total} right -> {a.out}")
    return 0


def load(path: str) -> dict[tuple[int, int, str, int], dict[str, Any]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {(r["length"], r["seed"], r["family"], r.get("ask", 0)): r for r in rows}


def cell(ref: list[dict], other: list[dict]) -> dict[str, Any]:
    """One (family, length) cell: dense `ref` against `other`, paired by prompt."""
    c = Paired.of((r["right"], o["right"]) for r, o in zip(ref, other, strict=True))
    return dict(
        n=c.n,
        dense=c.ref,
        other=c.other,
        lost=c.lost,
        gained=c.gained,
        p=c.p,
        keep=c.keep,
        counts=c.n > 0 and c.ref >= DENSE_FLOOR * c.n,
    )


def passes(c: dict[str, Any]) -> bool:
    return not c["counts"] or (c["keep"] >= KEEP and c["p"] >= ALPHA)


def compare(ref: dict, other: dict) -> dict[str, Any]:
    missing = set(ref) ^ set(other)
    if missing:
        raise SystemExit(f"ruler: the files do not hold the same prompts ({len(missing)} differ)")
    for key, row in ref.items():
        if row["prompt_sha"] != other[key]["prompt_sha"]:
            raise SystemExit(f"ruler: prompt {key} differs between the files (another tokenizer or corpus?)")
    out: dict[str, Any] = {"cells": {}, "lengths": {}}
    lengths = sorted({k[0] for k in ref})
    families = [f for f in tasks.FAMILIES if any(k[2] == f for k in ref)]
    for length in lengths:
        for family in families:
            keys = sorted(k for k in ref if k[0] == length and k[2] == family)
            out["cells"][f"{family}@{length}"] = cell([ref[k] for k in keys], [other[k] for k in keys])
        keys = sorted(k for k in ref if k[0] == length)
        cold = [k for k in keys if ref[k]["cold"]]
        ttft = {
            name: statistics.median(rows[k]["ttft_s"] for k in cold if rows[k]["ttft_s"] is not None)
            for name, rows in (("dense", ref), ("other", other))
            if any(rows[k]["ttft_s"] is not None for k in cold)
        }
        counting = [c for name, c in out["cells"].items() if name.endswith(f"@{length}") and c["counts"]]
        out["lengths"][length] = dict(
            all=cell([ref[k] for k in keys], [other[k] for k in keys]),
            cold=cell([ref[k] for k in cold], [other[k] for k in cold]),
            dense_right_counting=sum(c["dense"] for c in counting),
            ttft_p50_s=ttft,
            ttft_ratio=ttft["dense"] / ttft["other"] if len(ttft) == 2 else None,
        )
    out["pass"] = all(passes(c) for c in out["cells"].values())
    return out


def markdown(name: str, result: dict[str, Any]) -> str:
    lines = [
        f"### {name}",
        "",
        "| family | length | n | dense | sparse | lost | gained | McNemar p | kept | counts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, c in result["cells"].items():
        family, length = key.split("@")
        keep = "—" if c["keep"] is None else f"{c['keep']:.3f}"
        verdict = ("yes" if passes(c) else "**FAILS**") if c["counts"] else "no (dense < 50 %)"
        lines.append(
            f"| {family} | {length} | {c['n']} | {c['dense']} | {c['other']} | {c['lost']} | {c['gained']} "
            f"| {c['p']:.3g} | {keep} | {verdict} |"
        )
    lines += [
        "",
        "| length | items | dense right | sparse right | lost | gained | p | dense right, counting cells "
        "| cold lost / gained | TTFT p50 dense / sparse | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for length, s in result["lengths"].items():
        a, c = s["all"], s["cold"]
        t = s["ttft_p50_s"]
        ttft = " / ".join(f"{t[k]:.3f} s" for k in ("dense", "other") if k in t) or "—"
        ratio = "—" if s["ttft_ratio"] is None else f"{s['ttft_ratio']:.2f}x"
        lines.append(
            f"| {length} | {a['n']} | {a['dense']} | {a['other']} | {a['lost']} | {a['gained']} | {a['p']:.3g} "
            f"| {s['dense_right_counting']} | {c['lost']} / {c['gained']} | {ttft} | {ratio} |"
        )
    lines.append("")
    lines.append(
        f"every counting cell keeps >= {KEEP:.0%} of dense's answers with p >= {ALPHA}: {result['pass']}"
    )
    return "\n".join(lines)


def choose(results: dict[str, dict[str, Any]]) -> str:
    """The rule that picks a default on the dev split, fixed before its runs: among the files whose every
    counting cell passes, the fastest at the longest length (cold TTFT ratio); if none passes, the fewest net
    items lost in counting cells, then the fastest."""

    def speed(result: dict[str, Any]) -> float:
        longest = result["lengths"][max(result["lengths"], key=int)]
        return longest["ttft_ratio"] or 0.0

    def net_lost(result: dict[str, Any]) -> int:
        return sum(c["lost"] - c["gained"] for c in result["cells"].values() if c["counts"])

    passing = [path for path, r in results.items() if r["pass"]]
    if passing:
        return max(passing, key=lambda path: speed(results[path]))
    return min(results, key=lambda path: (net_lost(results[path]), -speed(results[path])))


def cmd_compare(a: argparse.Namespace) -> int:
    ref = load(a.files[0])
    results = {}
    text = []
    for path in a.files[1:]:
        results[path] = compare(ref, load(path))
        text.append(markdown(f"{a.files[0]} (dense) vs {path}", results[path]))
    print("\n\n".join(text))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if a.md:
        Path(a.md).write_text("\n\n".join(text) + "\n")
    if a.choose:
        chosen = choose(results)
        print(f"chosen by the dev rule: {chosen}")
        Path(a.choose).write_text(chosen + "\n")
    return 0 if all(r["pass"] for r in results.values()) else 1


def run_args(run: argparse.ArgumentParser) -> None:
    run.add_argument("--split", choices=sorted(corpora.SPLITS), default="heldout")
    run.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="prompt lengths (tokens)")
    run.add_argument("--prompts", type=int, default=40, help="cases (haystacks) per length")
    run.add_argument("--first", type=int, default=0, help="the split's first case (skip earlier ones)")
    run.add_argument(
        "--cold",
        choices=("rotate", *tasks.FAMILIES),
        default="rotate",
        help="which question of a case goes cold (alone, a fresh prefill): the families in turn, or one family",
    )


def compare_args(cmp_: argparse.ArgumentParser) -> None:
    cmp_.add_argument("--md", help="write the tables here too")
    cmp_.add_argument("--choose", help="write the file the dev rule (`choose`) picks here")


def main() -> int:
    return run_and_compare(__doc__, cmd_run, cmd_compare, run_args, compare_args)


if __name__ == "__main__":
    sys.exit(main())
