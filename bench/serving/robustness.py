"""Bad inputs, repeated long prompts and the idle memory check against a running SGLang server.

    python -m bench.serving.robustness run --url URL --label ext --model-dir DIR --out ext.json \
        [--long-reps 20] [--long-len 100000] [--server-log PATH]
    python -m bench.serving.robustness compare stock.json ext.json

`run`, in order:
1. malformed requests (empty input_ids, one token over the context length, neither text nor
   input_ids, max_new_tokens < 0): the HTTP status and error text of each, and whether /health still
   answers 200 after it;
2. `--long-reps` prompts of `--long-len` random tokens, two at a time (each distinct: every one is
   prefilled in full, and the pool must evict earlier ones), max_new_tokens 4: failures and TTFTs;
3. an idle spell (SGLang checks its KV pools for leaks on every idle pass and, by default, fails hard
   when it finds one): /health after it, and the server log searched for leak reports;
4. last, the requests that take stock 0.5.17 down (ids >= the vocabulary, a negative id).
`compare` prints whether every variant answered every malformed request the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.lib.client import Client, server_info

LEAK_MARKERS = ("leak detected", "use-after-free", "Traceback (most recent call last)")


def _post(url: str, payload: dict[str, Any], timeout: float = 120.0) -> tuple[int, str]:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()[:600]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:600]
    except (urllib.error.URLError, OSError) as e:
        return -1, f"{type(e).__name__}: {e}"[:600]


def _answer(x: dict[str, Any]) -> tuple[int, str]:
    """Status and error text, without request ids (random hex) that differ between any two runs."""
    return x["status"], re.sub(r"[0-9a-f]{16,}", "<id>", x["body"])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=30) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def bad_requests(context_len: int, vocab: int) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(requests any server should answer, requests that may take a server down: sent last)."""
    greedy = {"max_new_tokens": 4, "temperature": 0.0}
    answered = {
        "empty_input_ids": {"input_ids": [], "sampling_params": greedy},
        "over_context_length": {"input_ids": [7] * (context_len + 1), "sampling_params": greedy},
        "no_prompt": {"sampling_params": greedy},
        "negative_max_new_tokens": {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": -1}},
    }
    risky = {
        "id_equal_vocab": {"input_ids": [1, 2, vocab, 3], "sampling_params": greedy},
        "id_far_over_vocab": {"input_ids": [1, 2, vocab + 100_000, 3], "sampling_params": greedy},
        "negative_id": {"input_ids": [1, -5, 3], "sampling_params": greedy},
    }
    return answered, risky


def send_bad(url: str, label: str, requests: dict[str, dict[str, Any]], into: dict[str, Any]) -> None:
    for name, payload in requests.items():
        status, body = _post(url + "/generate", payload)
        into[name] = dict(status=status, body=body, healthy_after=healthy(url))
        print(f"[{label}] {name}: HTTP {status} {body[:160]!r}", flush=True)


async def long_prompts(
    url: str, label: str, reps: int, length: int, vocab: int, deadline: float
) -> dict[str, Any]:
    rng = random.Random(2026)
    sem = asyncio.Semaphore(2)
    async with Client(url, label, None, progress=False) as client:

        async def one(i: int):
            async with sem:
                if time.time() > deadline:
                    return None
                ids = [rng.randrange(10, vocab - 10) for _ in range(length)]
                return await client.generate(
                    ids, workload="long", group="long", idx=i, t0=0.0, max_new_tokens=4
                )

        records = [r for r in await asyncio.gather(*(one(i) for i in range(reps))) if r is not None]
    ttfts = [r.ttft_s for r in records if r.error is None and r.ttft_s is not None]
    return dict(
        requested=reps,
        sent=len(records),
        failures=sum(r.error is not None or r.output_tokens != 4 for r in records),
        errors=[r.error for r in records if r.error][:5],
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
        ttft_max_s=max(ttfts) if ttfts else None,
    )


def cmd_run(a: argparse.Namespace) -> int:
    url = a.url.rstrip("/")
    config = json.loads((Path(a.model_dir) / "config.json").read_text())
    info = server_info(url)
    context_len = int(info.get("context_length") or config["max_position_embeddings"])
    vocab = int(config["vocab_size"])
    result: dict[str, Any] = dict(label=a.label, context_length=context_len, vocab_size=vocab, bad_inputs={})
    answered, risky = bad_requests(context_len, vocab)
    send_bad(url, a.label, answered, result["bad_inputs"])
    if a.long_reps:
        result["long"] = asyncio.run(long_prompts(url, a.label, a.long_reps, a.long_len, vocab, a.deadline))
        print(f"[{a.label}] long prompts: {result['long']}", flush=True)
    time.sleep(a.idle_s)
    result["healthy_after_idle"] = healthy(url)
    if a.server_log:
        text = Path(a.server_log).read_text(errors="replace")
        result["log_findings"] = [
            line[:300] for line in text.splitlines() if any(m in line for m in LEAK_MARKERS)
        ][:10]
    send_bad(url, a.label, risky, result["bad_inputs"])
    Path(a.out).write_text(json.dumps(result, indent=1))
    ok = (
        result["healthy_after_idle"]
        and all(r["healthy_after"] for r in result["bad_inputs"].values())
        and not result.get("log_findings")
        and not (result.get("long") or {}).get("failures")
    )
    print(
        f"[{a.label}] healthy after idle: {result['healthy_after_idle']}; log findings: {result.get('log_findings')}"
    )
    return 0 if ok else 1


def cmd_compare(a: argparse.Namespace) -> int:
    loaded = [json.loads(Path(p).read_text()) for p in a.files]
    runs = {r["label"]: r for r in loaded}
    names = list(runs)
    print("\n### Malformed requests (bench/serving/robustness.py)\n")
    print("| request | " + " | ".join(names) + " | same answer |")
    print("|---|" + "---|" * len(names) + "---|")
    same_all = True
    for case in runs[names[0]]["bad_inputs"]:
        answers = [runs[n]["bad_inputs"].get(case) for n in names]
        same = all(
            x is not None and (x["status"], x["body"]) == (answers[0]["status"], answers[0]["body"])
            for x in answers
        )
        same_all &= same
        cells = [
            f"HTTP {x['status']}{'' if x['healthy_after'] else ' (server down)'}" if x else "-"
            for x in answers
        ]
        print(f"| {case} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    for n in names:
        r = runs[n]
        print(
            f"\n{n}: healthy after idle {r['healthy_after_idle']}, leak reports in log: {len(r.get('log_findings') or [])}"
            + (f", long prompts {r['long']}" if r.get("long") else "")
        )
    return 0 if same_all else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--url", required=True)
    run.add_argument("--label", required=True)
    run.add_argument("--model-dir", required=True, help="the model's folder (config.json: vocab_size)")
    run.add_argument("--out", required=True)
    run.add_argument("--long-reps", type=int, default=20)
    run.add_argument("--long-len", type=int, default=100_000)
    run.add_argument("--idle-s", type=float, default=8.0)
    run.add_argument(
        "--deadline", type=float, default=float("inf"), help="epoch seconds: send no long prompt after"
    )
    run.add_argument("--server-log")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("files", nargs="+")
    a = parser.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
