"""The RULER-style suite's retrieval items through transformers, teacher-forced: where sparse prefill loses them.

    python -m bench.accuracy.ruler_forced run --model-dir DIR --out-dir OUT [--split dev] [--lengths 130000]
        [--prompts 8] [--first 0] [--configs SCORER:VALUE[@OPT,...] ...] [policy options of sparse_accuracy]
    python -m bench.accuracy.ruler compare OUT/dense.jsonl OUT/<config>.jsonl ...
    python -m bench.accuracy.ruler_forced choose OUT/summary.json --among CONFIG ...   # -> server flags
    python -m bench.accuracy.ruler_forced closer OUT/dense.jsonl OUT/A.jsonl OUT/B.jsonl
    python -m bench.accuracy.ruler_forced merge OUT1 OUT2 ... --out-dir OUT   # runs over other cases, joined
    python -m bench.accuracy.ruler_forced guarded OUT --config CONFIG [--bounds ...]  # a run with --guard 1e-9

The cases of `ruler.py` (the same haystacks, needles and questions: `ruler.cases_of`), without a server.
Per case the haystack runs once per config: dense, then through each config's policy (`sparse_accuracy`'s
`SparseAttention`: the serving policy, FlashInfer in bf16, or exact fp32 attention over the kept blocks with
--emulate; `oracle:MASS`, `@LA-B`: only layers A..B sparse), its KV kept; then
every `single` and `multikey` question runs densely over that KV with its answer appended, as a question that
hits the radix cache runs on the server. An item is right when the argmax at every answer position is the
answer's token (greedy decoding would write the answer's number first); its log-probability is the sum over
the answer's tokens. One JSONL per config in --out-dir, rows keyed like `ruler run`'s, so `ruler compare`
gives lost, gained and McNemar's p; `summary.json` and stdout add, per config and family, the mean change of
the answer's log-probability against dense with its spread (and the median of its size), and the kept-block
density (and, per sparse case, every checked layer's guard statistic: `guarded` gives the decline rate and
answers of a guard at any bound); `closer` counts the items whose answer log-probability one config keeps
nearer dense's than another.
`choose` applies the dev rule (`choose`) and prints the chosen config's server flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.accuracy import corpora, ruler, sparse_accuracy, tasks
from bench.accuracy.guard_rate import declines_at
from bench.lib.stats import Paired, mcnemar_exact
from sglang_prefill_ext.config import sparse_flags
from sglang_prefill_ext.ops.settings import SparseSettings

FAMILIES = ("single", "multikey")  # one number per answer: its tokens are the item


def slug(name: str) -> str:
    """A file name for a config's text."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def answer_ids(encode: Any, question: tasks.Question) -> tuple[list[int], list[int]]:
    """The question's prompt suffix and its answer's tokens, tokenized together (the answer follows the
    question's last word as greedy decoding would write it)."""
    asked = encode("\n\n" + question.text)
    both = encode("\n\n" + question.text + " " + question.answers[0])
    if both[: len(asked)] != asked:
        raise ValueError(f"ruler_forced: the answer changes the question's tokens ({question.text[-40:]!r})")
    return asked, both[len(asked) :]


def forced_item(
    model: Any, cache: Any, context_len: int, asked: list[int], answer: list[int]
) -> tuple[bool, float]:
    """Whether the argmax is the answer at every answer position, and the answer's log-probability, with the
    question and answer run over `cache` (cropped back to the context after)."""
    device = model.lm_head.weight.device
    ids = torch.tensor([asked + answer], device=device)
    hidden = model.model(ids, past_key_values=cache, use_cache=True).last_hidden_state[0]
    cache.crop(context_len)
    logp = model.lm_head(hidden[len(asked) - 1 : -1]).float().log_softmax(-1)
    target = torch.tensor(answer, device=device)
    return bool((logp.argmax(-1) == target).all()), float(logp.gather(-1, target[:, None]).sum())


def run_config(
    model: Any, context: list[int], items: list[tuple[tasks.Question, list[int], list[int]]], dense_name: str
) -> tuple[list[tuple[bool, float]], float]:
    """The haystack through the model's current attention, then each item densely over its KV; with the
    haystack's forward time."""
    from transformers import DynamicCache

    device = model.lm_head.weight.device
    cache = DynamicCache()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    model.model(torch.tensor([context], device=device), past_key_values=cache, use_cache=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    sparse_accuracy.use_attention(model, "sdpa")
    out = [forced_item(model, cache, len(context), asked, answer) for _, asked, answer in items]
    sparse_accuracy.use_attention(model, dense_name)
    return out, seconds


def summarize(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per config and family: items, right, lost / gained against dense, and the mean change of the answer's
    log-probability with its standard deviation; per config the mean kept-block density over the haystacks
    whose rows carry one (a case's first item)."""
    dense = rows["dense"]
    out: dict[str, Any] = {}
    for name, config_rows in rows.items():
        per_family = {}
        for family in FAMILIES:
            pairs = [(d, r) for d, r in zip(dense, config_rows, strict=True) if d["family"] == family]
            deltas = [r["logprob"] - d["logprob"] for d, r in pairs]
            c = Paired.of((d["right"], r["right"]) for d, r in pairs)
            per_family[family] = dict(
                n=c.n,
                dense=c.ref,
                right=c.other,
                lost=c.lost,
                gained=c.gained,
                p=c.p,
                dlogprob=statistics.mean(deltas) if deltas else 0.0,
                dlogprob_sd=statistics.stdev(deltas) if len(deltas) > 1 else 0.0,
                dlogprob_abs_median=statistics.median(map(abs, deltas)) if deltas else 0.0,
            )
        forward = [r["forward_s"] for r in config_rows if r["first"]]
        density = [r["density"] for r in config_rows if r["first"] and r.get("density") is not None]
        out[name] = dict(
            families=per_family,
            density=statistics.mean(density) if density else 1.0,
            forward_s=statistics.median(forward),
        )
    return out


def closer(dense: dict[Any, dict], a: dict[Any, dict], b: dict[Any, dict]) -> tuple[int, int, float]:
    """Items (`ruler.load`'s rows of three runs) whose answer log-probability run `a` keeps closer to dense's
    than run `b` does, those where `b` does, and the sign test's two-sided p (ties left out)."""
    if not dense.keys() == a.keys() == b.keys():
        raise ValueError("ruler_forced closer: the runs' items differ")
    gaps = [
        (abs(a[k]["logprob"] - d["logprob"]), abs(b[k]["logprob"] - d["logprob"])) for k, d in dense.items()
    ]
    a_closer, b_closer = sum(x < y for x, y in gaps), sum(y < x for x, y in gaps)
    return a_closer, b_closer, mcnemar_exact(a_closer, b_closer)


def guarded(dense: dict[Any, dict], sparse: dict[Any, dict], bounds: list[float]) -> list[dict[str, Any]]:
    """A guard at each bound, from one run (`ruler.load`'s rows) whose sparse rows carry every checked layer's
    statistic (`--guard` at a bound that declines nothing, e.g. 1e-9): a case whose first checked layer under
    the bound would decline answers as dense (exact when that is the first sparse layer, the only one
    `--guard-every 0` checks; a later one leaves the layers before it sparse, so `late` counts the cases so
    approximated), else as the run. Per bound: cases declined, late ones, their share, the kept density with
    declined cases at 1, and per family the `Paired` counts against dense."""
    if dense.keys() != sparse.keys():
        raise ValueError("ruler_forced guarded: the runs' items differ")
    firsts = {(r["length"], r["seed"]): r for r in sparse.values() if r["first"]}
    if any(r.get("guard") is None for r in firsts.values()):
        raise ValueError("ruler_forced guarded: a case has no guard statistics (run it with --guard 1e-9)")
    stats = {case: {int(k): g for k, g in r["guard"].items()} for case, r in firsts.items()}
    first_layer = min(min(s) for s in stats.values())
    out = []
    for bound in bounds:
        at = {case: layer for case, s in stats.items() if (layer := declines_at(s, bound)) is not None}
        families = {
            family: dataclasses.asdict(
                Paired.of(
                    (d["right"], (d if key[:2] in at else sparse[key])["right"])
                    for key, d in dense.items()
                    if d["family"] == family
                )
            )
            for family in FAMILIES
        }
        out.append(
            dict(
                bound=bound,
                cases=len(firsts),
                declined=len(at),
                late=sum(layer != first_layer for layer in at.values()),
                rate=len(at) / len(firsts),
                density=statistics.mean(1.0 if c in at else r["density"] for c, r in firsts.items()),
                families=families,
            )
        )
    return out


def table(columns: str, rows: list[list[str]]) -> str:
    """A markdown table of the comma-separated `columns`, the first left-aligned and the rest right (but those
    named with a leading `<`)."""
    header = columns.split(",")
    align = ["---" if i == 0 or h.startswith("<") else "---:" for i, h in enumerate(header)]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(h.lstrip("<") for h in line) + " |" for line in lines)


def report(summary: dict[str, Any]) -> str:
    return table("config,<family,n,dense,right,lost,gained,p,d logprob (sd),density,forward s", [
        [name, family, str(f["n"]), str(f["dense"]), str(f["right"]), str(f["lost"]), str(f["gained"]),
         f"{f['p']:.3g}", f"{f['dlogprob']:+.3f} ({f['dlogprob_sd']:.3f})", f"{s['density']:.3f}",
         f"{s['forward_s']:.2f}"]
        for name, s in summary.items() for family, f in s["families"].items()
    ])  # fmt: skip


def guard_report(found: list[dict[str, Any]]) -> str:
    return table("bound,declined (late),rate,density,<family,dense,right,lost,gained,p", [
        [f"{g['bound']:g}", f"{g['declined']} of {g['cases']} ({g['late']})", f"{g['rate']:.2f}",
         f"{g['density']:.3f}", family, str(f["ref"]), str(f["other"]), str(f["lost"]), str(f["gained"]),
         f"{f['p']:.3g}"]
        for g in found for family, f in g["families"].items()
    ])  # fmt: skip


def choose_bound(found: list[dict[str, Any]]) -> float | None:
    """The guard's dev rule, fixed before the dev run (the `choose` rule's twin): the lowest bound (fewest
    declines) at which the guarded selection keeps every dense answer net (lost - gained <= 0 over the
    families); None when no bound does."""
    return min((g["bound"] for g in found if net_lost(g["families"]) <= 0), default=None)


def net_lost(families: dict[str, dict[str, Any]]) -> int:
    """Dense's answers lost net of those gained, over the families (both dev rules' test)."""
    return sum(f["lost"] - f["gained"] for f in families.values())


CHOOSE_BY = ("density", "forward_s")


def choose(summary: dict[str, Any], among: list[str], by: str = "density") -> str:
    """The dev rule, fixed before the dev run: among the `among` configs, those that keep every dense answer
    net (lost - gained <= 0 over the families) pass, and the passing one lowest in `by` is chosen: the least
    dense, or the fastest forward (`forward_s`: for candidates whose cost is not their density, e.g. strides);
    a tie: the higher answer log-probability. If none passes, the fewest net lost, then the higher answer
    log-probability."""

    def dlogprob(name: str) -> float:
        families = summary[name]["families"].values()
        return sum(f["dlogprob"] * f["n"] for f in families) / max(1, sum(f["n"] for f in families))

    passing = [name for name in among if net_lost(summary[name]["families"]) <= 0]
    if passing:
        return min(
            passing,
            key=lambda n: (summary[n][by], -dlogprob(n)),
        )
    return min(among, key=lambda n: (net_lost(summary[n]["families"]), -dlogprob(n)))


def server_flags(config_text: str) -> list[str]:
    """The server flags that run a --configs entry's selection (the server's other settings at their defaults);
    sparse layers only in a range (`LA-B`) have no server flag."""
    config = sparse_accuracy.parse_config(config_text)
    if config.sparse_layers is not None:
        raise ValueError(
            f"{config_text!r}: a sparse layer range is the bench's alone, no server flag runs it"
        )
    settings = config.settings(SparseSettings.block_size, SparseSettings.samples, SparseSettings.local_blocks)
    return ["--enable-prefill-ext", "--prefill-ext-sparse", *sparse_flags(settings)]


def cmd_choose(a: argparse.Namespace) -> None:
    """Print the server flags of the config the dev rule picks from a run's summary.json."""
    summary = json.loads(Path(a.summary).read_text())
    chosen = choose(summary, a.among, a.by)
    print(f"chosen by the dev rule: {chosen}", file=sys.stderr)
    if a.config_out:
        Path(a.config_out).write_text(chosen + "\n")
    print(" ".join(server_flags(chosen)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="teacher-forced items per config -> --out-dir")
    sparse_accuracy.policy_args(run)
    run.add_argument("--out-dir", type=Path, required=True)
    run.add_argument("--split", choices=sorted(corpora.SPLITS), default="dev")
    run.add_argument("--lengths", type=int, nargs="+", default=[130000])
    run.add_argument("--prompts", type=int, default=8)
    run.add_argument("--first", type=int, default=0)
    pick = sub.add_parser(
        "choose", help="the dev rule's pick among configs of a summary.json, as server flags"
    )
    pick.add_argument("summary")
    pick.add_argument("--among", nargs="+", required=True, help="--configs entries of the run")
    pick.add_argument("--config-out", help="also write the chosen --configs entry here")
    pick.add_argument(
        "--by", choices=CHOOSE_BY, default="density", help="what the passing config must be lowest in"
    )
    near = sub.add_parser(
        "closer",
        help="items whose answer log-probability A keeps closer to dense's than B, and the sign test",
    )
    near.add_argument("dense")
    near.add_argument("a")
    near.add_argument("b")
    join = sub.add_parser(
        "merge", help="runs of the same configs on other cases -> one run's JSONL and summary"
    )
    join.add_argument("runs", nargs="+", type=Path, help="--out-dir of each run")
    join.add_argument("--out-dir", type=Path, required=True)
    guard = sub.add_parser("guarded", help="a guard at each bound, from a run with --guard 1e-9")
    guard.add_argument("run", type=Path, help="the run's --out-dir")
    guard.add_argument("--config", required=True, help="the --configs entry the guard protects")
    guard.add_argument("--bounds", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.75, 0.8])
    a = parser.parse_args()
    if a.command == "choose":
        cmd_choose(a)
    elif a.command == "merge":
        print(report(write(a.out_dir, merge(a.runs))))
    elif a.command == "guarded":
        dense, sparse = (ruler.load(str(a.run / f"{slug(n)}.jsonl")) for n in ("dense", a.config))
        found = guarded(dense, sparse, a.bounds)
        print(guard_report(found))
        print(f"the dev rule's bound (the lowest keeping every dense answer net): {choose_bound(found)}")
    elif a.command == "closer":
        a_closer, b_closer, p = closer(ruler.load(a.dense), ruler.load(a.a), ruler.load(a.b))
        print(f"{a.a} closer to dense on {a_closer} items, {a.b} on {b_closer} (sign test p = {p:.3g})")
    else:
        cmd_run(a, run)


def merge(runs: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """The rows of runs of the same configs over different cases, each config's in case order (keyed by the
    `label` its rows carry); a case in two runs, or a config missing from one, is refused."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        names = [json.loads(p.read_text().splitlines()[0])["label"] for p in sorted(run.glob("*.jsonl"))]
        if rows and sorted(names) != sorted(rows):
            raise ValueError(f"ruler_forced merge: {run} has configs {sorted(names)}, not {sorted(rows)}")
        for path in sorted(run.glob("*.jsonl")):
            config_rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            rows.setdefault(config_rows[0]["label"], []).extend(config_rows)
    for name, config_rows in rows.items():
        keys = [(r["length"], r["seed"], r["family"], r.get("ask", 0)) for r in config_rows]
        if len(set(keys)) != len(keys):
            raise ValueError(f"ruler_forced merge: {name} has an item twice")
    return rows


def cmd_run(a: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    loaded = sparse_accuracy.load(a, parser)
    model, tokenizer = loaded.model, loaded.tokenizer

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    a.out_dir.mkdir(parents=True, exist_ok=True)
    names = ["dense", *loaded.attentions]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for case_no, (fields, case) in enumerate(
        ruler.cases_of(a.split, a.lengths, a.prompts, a.first, tokenizer)
    ):
        items = [(q, *answer_ids(encode, q)) for q in case.questions if q.family in FAMILIES]
        with torch.no_grad():
            for n, name in enumerate(names):
                if name == "dense":
                    sparse_accuracy.use_attention(model, loaded.dense_attention)
                else:
                    sparse_accuracy.use_attention(model, f"prefill_ext_sparse_{n}", loaded.attentions[name])
                results, seconds = run_config(model, case.context, items, loaded.dense_attention)
                density, guard = None, None
                if name != "dense":
                    forward = loaded.attentions[name].densities[-1]
                    density = (
                        statistics.mean(statistics.mean(h) for h in forward.values()) if forward else 1.0
                    )
                    guard = {str(layer): g for layer, g in loaded.attentions[name].guards[-1].items()}
                for i, ((q, asked, _), (right, logprob)) in enumerate(zip(items, results, strict=True)):
                    rows[name].append(
                        dict(
                            fields,
                            label=name,
                            family=q.family,
                            ask=q.ask,
                            cold=False,
                            first=i == 0,
                            prompt_sha=ruler.prompt_sha(case.context + asked),
                            answers=list(q.answers),
                            right=right,
                            logprob=logprob,
                            forward_s=seconds,
                            density=density,
                            guard=guard,
                            ttft_s=None,
                        )
                    )
        print(f"case {case_no + 1}: " + ", ".join(
            f"{name} {sum(r['right'] for r in rows[name][-len(items):])}/{len(items)}" for name in names
        ), flush=True)  # fmt: skip
        summary = write(a.out_dir, rows)  # after every case: a run cut short keeps its cases
    print(report(summary), flush=True)


def write(out_dir: Path, rows: dict[str, list[dict[str, Any]]]) -> dict:
    """Each config's JSONL and summary.json, from the rows so far."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, config_rows in rows.items():
        with open(out_dir / f"{slug(name)}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in config_rows)
    summary = summarize(rows)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
