"""Blended against full prefill on multi-document QA (`rag_qa`), teacher-forced through transformers.

    python -m bench.accuracy.blend_accuracy --model-dir DIR --out-dir OUT [--split heldout] [--items 50]
        [--families single multihop] [--chunks 8] [--chunk-tokens 512 2048]
        [--configs fixed:0 fixed:0.15 deviation:0.15 fixed:1] [--check-layer 1] [--device cuda]
        [--dtype bfloat16]

Per item: the prompt with its answer appended runs once as a full prefill, and once per config as a
blended prefill (`sglang_prefill_ext.blend.prefill`, the same layers and attention): each chunk's KV
cached as the store caches a chunk seen for the first time (after the header alone), moved to its span,
and `RULE:RATIO` of the chunk tokens recomputed (`fixed`: each chunk's first tokens; `deviation`:
CacheBlend's largest KV deviation at --check-layer). `fixed:0` reuses every chunk token as cached;
`fixed:1` recomputes all of them, so it must score exactly as full. `deviation:RATIO@LAYER` checks at
LAYER instead of --check-layer (the cross-chunk tokens a task needs may deviate only past layer 1).

An item is right when the argmax at every answer position is the answer's token (greedy decoding would
write the answer first); its log-probability is the sum over the answer's tokens. Those are the value
and the space before it: the question's answer line ends as the fact does before the value
(`rag_qa.LEAD`), so no rival formatting token (the fact's ':') is scored. Each row keeps the answer's
text and the argmax's (`answer`, `predicted`). Per config and family: items right, lost and gained against full, McNemar's exact p, the share of full's right
answers kept net of gained, the answer tokens' perplexity and its change against full, and the
share of chunk tokens recomputed. A cell passes (issue 40's targets) when it keeps >= KEEP of full's
answers with p >= ALPHA and its perplexity is within PPL_RISE of full's. Rows in OUT/<config>.jsonl,
the summary in OUT/summary.json, the table on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.accuracy import corpora, rag_qa
from bench.accuracy.ruler_forced import answer_ids, slug
from bench.lib.stats import Paired
from sglang_prefill_ext.blend.prefill import (
    Decoder,
    Prefill,
    Rule,
    blended_prefill,
    cached_chunk,
    full_prefill,
    reused_kv,
)
from sglang_prefill_ext.blend.select import chunk_mask

KEEP = 0.99
ALPHA = 0.05
PPL_RISE = 0.01
DEFAULT_CONFIGS = ("fixed:0", "fixed:0.15", "deviation:0.15", "fixed:1")


@dataclasses.dataclass(frozen=True)
class Config:
    text: str
    rule: Rule
    ratio: float
    check_layer: int | None = None  # the deviation rule's layer; None: --check-layer


def parse_config(text: str) -> Config:
    """RULE:RATIO, or deviation:RATIO@LAYER for a check layer other than --check-layer's."""
    head, at, layer = text.partition("@")
    rule, _, ratio = head.partition(":")
    try:
        config = Config(text, Rule(rule), float(ratio), int(layer) if at else None)
    except ValueError:
        config = None
    if (
        config is None
        or not 0 <= config.ratio <= 1
        or (at and (config.rule is not Rule.DEVIATION or config.check_layer < 0))
    ):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a config is RULE:RATIO, RULE one of {[r.value for r in Rule]}, RATIO in [0, 1], "
            "or deviation:RATIO@LAYER"
        )
    return config


def scored(
    decoder: Decoder, result: Prefill, prompt_len: int, answer: list[int]
) -> tuple[bool, float, list[int]]:
    """Whether the argmax is the answer at every answer position, the answer's log-probability, and the
    argmax tokens (which answer token a wrong item missed, and with what)."""
    last = len(answer) + 1  # the prompt's last token and the answer's: all outside every chunk, so computed
    if result.rows[-last:].tolist() != list(range(prompt_len - 1, prompt_len + len(answer))):
        raise ValueError("blend_accuracy: the question and answer rows were not all computed")
    logp = decoder.logits(result.hidden[-last:-1]).float().log_softmax(-1)
    target = torch.tensor(answer, device=logp.device)
    argmax = logp.argmax(-1)
    return bool((argmax == target).all()), float(logp.gather(-1, target[:, None]).sum()), argmax.tolist()


def _timed(device: torch.device, run: Any) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def run_item(
    decoder: Decoder, item: rag_qa.Item, answer: list[int], configs: list[Config], check_layer: int
) -> dict[str, dict[str, Any]]:
    """Per config ("full" first): right, log-probability, argmax tokens, chunk tokens recomputed, forward
    seconds."""
    ids = item.ids + answer
    full, seconds = _timed(decoder.device, lambda: full_prefill(decoder, ids))
    right, logprob, argmax = scored(decoder, full, len(item.ids), answer)
    out = {"full": dict(right=right, logprob=logprob, argmax=argmax, recomputed=1.0, forward_s=seconds)}
    system = item.ids[: item.header_len]
    chunks = [cached_chunk(decoder, system, item.ids[s:e]) for s, e in item.spans]
    in_chunks = chunk_mask(item.spans, len(ids), decoder.device)
    for config in configs:
        reused = reused_kv(decoder, len(ids), item.spans, chunks)
        result, seconds = _timed(
            decoder.device,
            lambda c=config, r=reused: blended_prefill(
                decoder,
                ids,
                item.spans,
                r,
                c.ratio,
                c.rule,
                check_layer if c.check_layer is None else c.check_layer,
            ),
        )
        right, logprob, argmax = scored(decoder, result, len(item.ids), answer)
        recomputed = float((result.computed & in_chunks).sum() / in_chunks.sum())
        out[config.text] = dict(
            right=right, logprob=logprob, argmax=argmax, recomputed=recomputed, forward_s=seconds
        )
    return out


def summarize(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per config and family: against full, as the module's docstring says."""
    full = rows["full"]
    out: dict[str, Any] = {}
    for name, config_rows in rows.items():
        out[name] = {}
        for family in sorted({r["family"] for r in full}):
            pairs = [(f, r) for f, r in zip(full, config_rows, strict=True) if f["family"] == family]
            c = Paired.of((f["right"], r["right"]) for f, r in pairs)
            tokens = sum(r["answer_tokens"] for _, r in pairs)
            ppl = math.exp(-sum(r["logprob"] for _, r in pairs) / tokens)
            full_ppl = math.exp(-sum(f["logprob"] for f, _ in pairs) / tokens)
            out[name][family] = dict(
                n=c.n,
                full=c.ref,
                right=c.other,
                lost=c.lost,
                gained=c.gained,
                p=c.p,
                keep=c.keep,
                ppl=ppl,
                ppl_change=ppl / full_ppl - 1,
                recomputed=statistics.mean(r["recomputed"] for _, r in pairs),
                forward_s=statistics.median(r["forward_s"] for _, r in pairs),
                passes=(c.keep is None or c.keep >= KEEP) and c.p >= ALPHA and ppl / full_ppl - 1 <= PPL_RISE,
            )
    return out


def report(summary: dict[str, Any]) -> str:
    lines = [
        "| config | family | n | full | right | lost | gained | McNemar p | kept | answer ppl (change) "
        "| recomputed | forward s | passes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, families in summary.items():
        for family, c in families.items():
            keep = "—" if c["keep"] is None else f"{c['keep']:.3f}"
            lines.append(
                f"| {name} | {family} | {c['n']} | {c['full']} | {c['right']} | {c['lost']} | {c['gained']} "
                f"| {c['p']:.3g} | {keep} | {c['ppl']:.4f} ({c['ppl_change']:+.2%}) | {c['recomputed']:.3f} "
                f"| {c['forward_s']:.3f} | {'yes' if c['passes'] else '**no**'} |"
            )
    return "\n".join(lines)


def load(model_dir: str, device: str, dtype: str) -> tuple[Decoder, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return Decoder.of(model.to(device).eval()), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--split", choices=sorted(corpora.SPLITS), default="heldout")
    parser.add_argument("--items", type=int, default=50, help="items per family")
    parser.add_argument("--families", nargs="+", choices=rag_qa.FAMILIES, default=list(rag_qa.FAMILIES))
    parser.add_argument("--chunks", type=int, default=8, help="documents per item")
    parser.add_argument("--chunk-tokens", type=int, nargs=2, default=[512, 2048], metavar=("MIN", "MAX"))
    parser.add_argument(
        "--configs", type=parse_config, nargs="+", default=list(map(parse_config, DEFAULT_CONFIGS))
    )
    parser.add_argument("--check-layer", type=int, default=1, help="the deviation rule's layer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a = parser.parse_args()
    decoder, tokenizer = load(a.model_dir, a.device, a.dtype)

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    items = rag_qa.items_of(a.split, a.families, a.items, encode, a.chunks, *a.chunk_tokens)
    rows: dict[str, list[dict[str, Any]]] = {"full": [], **{c.text: [] for c in a.configs}}
    for n, (fields, item) in enumerate(items):
        asked, answer = answer_ids(encode, item.question)
        if item.ids[-len(asked) :] != asked:
            raise ValueError(
                "blend_accuracy: the item's question is not tokenized as answer_ids tokenizes it"
            )
        with torch.no_grad():
            results = run_item(decoder, item, answer, a.configs, a.check_layer)
        for name, result in results.items():
            rows[name].append(
                dict(
                    fields,
                    label=name,
                    prompt_tokens=len(item.ids),
                    answer_tokens=len(answer),
                    answer=tokenizer.decode(answer),
                    predicted=tokenizer.decode(result["argmax"]),
                    **result,
                )
            )
        print(
            f"item {n + 1}/{len(items)} ({fields['family']}, {len(item.ids)} tokens): "
            + ", ".join(f"{name} {'right' if r['right'] else 'wrong'}" for name, r in results.items()),
            flush=True,
        )
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name, config_rows in rows.items():
        with open(a.out_dir / f"{slug(name)}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in config_rows)
    summary = summarize(rows)
    (a.out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(report(summary), flush=True)


if __name__ == "__main__":
    main()
