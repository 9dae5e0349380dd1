"""The TTFT harness's numbers: per-workload summaries of the client's records (`summary.json`), and
the report over several summaries (markdown table, stock/ext ratios for two, TTFT CDF plot).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.lib.client import Record
from bench.lib.goodput import Targets, judge, summarize_goodput, tbt_p99
from bench.lib.stats import percentile

# --------------------------------------------------------------------------------------------
# Summaries


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def summarize(records: Sequence[Record], wall_s: float, targets: Targets) -> dict[str, Any]:
    ok = [r for r in records if r.error is None and r.ttft_s is not None]
    gaps = sorted(g for r in ok for g in r.tbt_s)
    verdicts = [
        judge(r.prompt_tokens, r.cached_tokens or 0, r.ttft_s, r.tbt_s, targets)
        for r in ok
        if r.ttft_s is not None
    ]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    uncached = prompt - cached
    reusable = sum(r.reusable_tokens for r in ok)
    recomputed = sum(max(0, r.reusable_tokens - (r.cached_tokens or 0)) for r in ok)
    first_sends = [r.t_send for r in ok]
    last_first = max((r.t_first for r in ok if r.t_first is not None), default=None)
    prefill_span = (last_first - min(first_sends)) if ok and last_first is not None else None
    per_req_prefill = [
        (r.prompt_tokens - (r.cached_tokens or 0)) / r.ttft_s for r in ok if r.ttft_s and r.ttft_s > 0
    ]
    decode = [
        (r.output_tokens - 1) / (r.e2e_s - r.ttft_s)
        for r in ok
        if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens > 1 and r.e2e_s > r.ttft_s
    ]
    decode_tokens = sum(max(0, r.output_tokens - 1) for r in ok)
    short = [r.ttft_s for r, v in zip(ok, verdicts, strict=True) if v.short]
    long = [r.ttft_s for r, v in zip(ok, verdicts, strict=True) if not v.short]
    return {
        "n": len(records),
        "errors": len(records) - len(ok),
        "error_samples": [r.error for r in records if r.error][:3],
        "ttft_s": _dist(ttfts),
        "ttft_short_s": _dist(short),
        "ttft_long_s": _dist(long),
        "e2e_s": _dist([r.e2e_s for r in ok if r.e2e_s is not None]),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "uncached_tokens": uncached,
        "hit_rate": cached / prompt if prompt else None,
        "reusable_tokens": reusable,
        "reuse_hit_rate": (cached / reusable) if reusable else None,
        "recomputed_tokens": recomputed,
        "prefill_tok_s": uncached / prefill_span if prefill_span else None,
        "prefill_tok_s_per_req_p50": percentile(per_req_prefill, 50),
        "decode_tok_s_per_req_p50": percentile(decode, 50),
        "decode_tok_s_total": decode_tokens / wall_s if wall_s > 0 else None,
        "tbt_s": _dist(gaps),
        "tbt_p99_per_req_s": _dist([p for r in ok if (p := tbt_p99(r.tbt_s)) is not None]),
        **summarize_goodput(verdicts, len(records), wall_s),
        "output_tokens": sum(r.output_tokens for r in ok),
        "wall_s": wall_s,
        "ttfts": sorted(ttfts),
        "ttfts_short": sorted(short),
        "tbts": gaps,
    }


def summarize_workload(
    records: Sequence[Record], wall_s: float, extra: dict[str, Any], targets: Targets
) -> dict[str, Any]:
    out = summarize(records, wall_s, targets)
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(r.group, []).append(r)
    out["groups"] = {}
    for g, recs in groups.items():
        s = summarize(recs, wall_s, targets)
        for values in ("ttfts", "ttfts_short", "tbts"):
            s.pop(values)
        s["ttft_values"] = [r.ttft_s for r in recs]
        s["cached_values"] = [r.cached_tokens for r in recs]
        out["groups"][g] = s
    out.update(extra)
    return out


def load_summary(path: Path) -> dict[str, Any]:
    if path.exists():
        with open(path) as f:
            return json.load(f)
    return {}


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


# --------------------------------------------------------------------------------------------
# report / compare

METRICS: tuple[tuple[tuple[str, ...], str, int], ...] = (
    (("ttft_s", "p50"), "TTFT p50 (s)", 3),
    (("ttft_s", "p95"), "TTFT p95 (s)", 3),
    (("ttft_s", "p99"), "TTFT p99 (s)", 3),
    (("e2e_s", "p50"), "e2e p50 (s)", 3),
    (("prefill_tok_s",), "prefill tok/s (uncached / span to last first token)", 0),
    (("prefill_tok_s_per_req_p50",), "prefill tok/s per request (p50)", 0),
    (("hit_rate",), "hit rate (cached / prompt tokens)", 3),
    (("reuse_hit_rate",), "cached / reusable tokens", 3),
    (("recomputed_tokens",), "recomputed tokens (reusable, not cached)", 0),
    (("decode_tok_s_per_req_p50",), "decode tok/s per request (p50)", 0),
    (("tbt_s", "p50"), "TBT p50, all gaps (s)", 3),
    (("tbt_s", "p99"), "TBT p99, all gaps (s)", 3),
    (("tbt_p99_per_req_s", "p50"), "TBT p99 of a request, median (s)", 3),
    (("ttft_short_s", "p99"), "short TTFT p99 (s)", 3),
    (("ttft_long_s", "p50"), "long TTFT p50 (s)", 3),
    (("long_ttft_over_alone_p50",), "long TTFT / alone on stock (p50)", 2),
    (("ttft_attainment_short",), "short requests within the TTFT target", 2),
    (("ttft_attainment_long",), "long requests within the TTFT target", 2),
    (("tbt_attainment",), "requests within the TBT target", 2),
    (("slo_attainment",), "requests within both targets", 2),
    (("goodput_req_s",), "goodput (req/s within both targets)", 2),
    (("errors",), "errors", 0),
)
# The goodput table's rows: the metric, its title, and whether higher is better.
GOODPUT_ROWS: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (("goodput_req_s",), "goodput (req/s)", True),
    (("slo_attainment",), "within both targets", True),
    (("ttft_short_s", "p50"), "short TTFT p50 (s)", False),
    (("ttft_short_s", "p99"), "short TTFT p99 (s)", False),
    (("ttft_long_s", "p50"), "long TTFT p50 (s)", False),
    (("tbt_s", "p99"), "TBT p99, all gaps (s)", False),
    (("tbt_p99_per_req_s", "p99"), "TBT p99 of a request, p99 (s)", False),
    (("decode_tok_s_per_req_p50",), "decode tok/s per request (p50)", True),
)


def _get(d: dict[str, Any], path: Sequence[str]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _ratio(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{a / b:.2f}"
    return "-"


def _median(xs: Iterable[Any]) -> float | None:
    vals = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(vals) if vals else None


def baseline_rows(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """group -> {median, min, max, n} of TTFT (single prompts) or of the burst's wall time."""
    wl = _get(summary, ("workloads", "baseline")) or {}
    rows: dict[str, dict[str, Any]] = {}
    for g, s in (wl.get("groups") or {}).items():
        if "burst" in g:
            vals = [v for v in (wl.get("burst_wall_s") or {}).get(g, []) if v is not None]
        else:
            vals = [v for v in s.get("ttft_values", []) if v is not None]
        rows[g] = {
            "median": _median(vals),
            "min": min(vals) if vals else None,
            "max": max(vals) if vals else None,
            "n": len(vals),
            "cached": _median(s.get("cached_values", [])),
            "errors": s.get("errors", 0),
        }
    return rows


def render_report(summaries: list[tuple[str, dict[str, Any]]], reference: dict[str, Any] | None) -> str:
    labels = [lab for lab, _ in summaries]
    lines: list[str] = []
    pair = len(summaries) == 2
    ratio_head = f" {labels[0]}/{labels[1]} |" if pair else ""
    ratio_rule = " ---: |" if pair else ""

    # Baseline: single prompts and the bursts
    base = [(lab, baseline_rows(s)) for lab, s in summaries]
    groups: list[str] = []
    for _, rows in base:
        groups += [g for g in rows if g not in groups]
    if groups:
        ref = (reference or {}).get("rows", {})
        lines.append("### Baseline (max_new_tokens=1; median of reps, [min–max]; bursts: wall to last token)")
        lines.append("")
        head = "| request |" + (" recorded |" if ref else "") + "".join(f" {lab} (s) |" for lab in labels)
        head += ratio_head + " cached (median) |"
        lines.append(head)
        lines.append(
            "| --- |" + (" ---: |" if ref else "") + " ---: |" * len(labels) + ratio_rule + " ---: |"
        )
        for g in groups:
            cells = [f"| {g} |"]
            if ref:
                cells.append(f" {fmt(ref.get(g), 3)} |")
            meds = []
            for _, rows in base:
                r = rows.get(g)
                meds.append(r["median"] if r else None)
                cells.append(
                    f" {fmt(r['median'])} [{fmt(r['min'])}–{fmt(r['max'])}] (n={r['n']}) |" if r else " - |"
                )
            if pair:
                cells.append(f" {_ratio(meds[0], meds[1])} |")
            cached = [rows[g]["cached"] for _, rows in base if g in rows]
            cells.append(f" {' / '.join('-' if c is None else f'{c:,.0f}' for c in cached)} |")
            lines.append("".join(cells))
        lines.append("")

    names: list[str] = []
    for _, s in summaries:
        names += [w for w in (s.get("workloads") or {}) if w != "baseline" and w not in names]
    for w in names:
        lines.append(f"### {w}")
        lines.append("")
        notes = []
        for lab, s in summaries:
            ws = _get(s, ("workloads", w)) or {}
            if "skipped" in ws or "failed" in ws:
                notes.append(f"{lab}: {ws.get('skipped') or ws.get('failed')}")
            for k in ("sessions", "pool_tokens", "working_set_over_pool", "arrival_rate_per_s"):
                if k in ws:
                    notes.append(f"{lab}: {k}={fmt(ws[k], 2)}")
        if notes:
            lines.append("; ".join(notes))
            lines.append("")
        lines.append("| metric |" + "".join(f" {lab} |" for lab in labels) + ratio_head)
        lines.append("| --- |" + " ---: |" * len(labels) + ratio_rule)
        for path, title, digits in METRICS:
            vals = [_get(s, ("workloads", w, *path)) for _, s in summaries]
            if all(v is None for v in vals):
                continue
            row = f"| {title} |" + "".join(f" {fmt(v, digits)} |" for v in vals)
            if pair:
                row += f" {_ratio(vals[0], vals[1])} |"
            lines.append(row)
        # per-group TTFT p50 for workloads whose groups mean something (turns, lengths, short/long)
        gnames: list[str] = []
        for _, s in summaries:
            gnames += [g for g in (_get(s, ("workloads", w, "groups")) or {}) if g not in gnames]
        if 1 < len(gnames) <= 8 and not all(g.startswith("doc") for g in gnames):
            for g in gnames:
                for q in ("p50", "p99"):
                    vals = [_get(s, ("workloads", w, "groups", g, "ttft_s", q)) for _, s in summaries]
                    row = f"| TTFT {q} {g} (s) |" + "".join(f" {fmt(v)} |" for v in vals)
                    if pair:
                        row += f" {_ratio(vals[0], vals[1])} |"
                    lines.append(row)
        lines.append("")
    if pair:
        lines.append(
            f"Ratios are {labels[0]}/{labels[1]}: for times above 1 means {labels[1]} is faster; "
            f"for tok/s and hit rate below 1 means {labels[1]} is better."
        )
    return "\n".join(lines) + "\n"


def render_goodput(summaries: list[tuple[str, dict[str, Any]]]) -> str:
    """Every variant side by side on the goodput metrics, and each ext* variant over the best stock*
    variant of the row (the best: highest goodput, lowest time); > 1 means the ext variant is better."""
    labels = [lab for lab, _ in summaries]
    stock = [i for i, lab in enumerate(labels) if lab.startswith("stock")]
    ext = [i for i, lab in enumerate(labels) if lab.startswith("ext")]
    names: list[str] = []
    for _, s in summaries:
        names += [
            w for w, ws in (s.get("workloads") or {}).items() if "goodput_req_s" in ws and w not in names
        ]
    if not names:
        return ""
    targets = next((s["targets"] for _, s in summaries if "targets" in s), None)
    lines = ["### Goodput (TTFT and TBT targets)", ""]
    if targets:
        lines += [f"Targets: {json.dumps(targets)}", ""]
    head = "| workload | metric |" + "".join(f" {lab} |" for lab in labels)
    head += " best stock |" + "".join(f" {labels[i]} / best stock |" for i in ext)
    lines += [head, "| --- | --- |" + " ---: |" * (len(labels) + 1 + len(ext))]
    for w in names:
        for path, title, higher in GOODPUT_ROWS:
            vals = [_get(s, ("workloads", w, *path)) for _, s in summaries]
            if all(v is None for v in vals):
                continue
            known = [i for i in stock if isinstance(vals[i], (int, float))]
            best = (max if higher else min)(known, key=lambda i: vals[i]) if known else None
            row = f"| {w} | {title} |" + "".join(f" {fmt(v)} |" for v in vals)
            row += f" {labels[best]} |" if best is not None else " - |"
            for i in ext:
                row += (
                    f" {_ratio(vals[i], vals[best]) if higher else _ratio(vals[best], vals[i])} |"
                    if best is not None
                    else " - |"
                )
            lines.append(row)
    return "\n".join(lines) + "\n"


Panel = tuple[str, str, list[tuple[str, list[float]]]]  # title, x label, (variant, sorted values)


def plot_panels(panels: Sequence[Panel], png: Path) -> bool:
    """One CDF per panel, a step line per variant, into `png`; False without matplotlib or panels."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        print("matplotlib is not importable: no CDF plot", file=sys.stderr)
        return False
    if not panels:
        return False
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, xlabel, lines) in zip(axes.flat, panels, strict=False):
        for lab, xs in lines:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{lab} (n={len(xs)})")
        vals = [x for _, xs in lines for x in xs if x > 0]
        if vals and max(vals) / min(vals) > 20:  # log only where it spans decades
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def _panels(summaries: list[tuple[str, dict[str, Any]]], key: str, title: str, xlabel: str) -> list[Panel]:
    """A panel per workload of the sorted values under `key` (a workload's field, or `group/field`)."""

    def values(s: dict[str, Any], w: str) -> list[float]:
        group, _, field = key.rpartition("/")
        path = ("workloads", w, "groups", group, field) if group else ("workloads", w, field)
        return sorted(v for v in _get(s, path) or [] if v is not None)

    names: list[str] = []
    for _, s in summaries:
        names += [w for w in s.get("workloads") or {} if values(s, w) and w not in names]
    return [
        (title.format(w), xlabel, [(lab, xs) for lab, s in summaries if (xs := values(s, w))]) for w in names
    ]


def plot_cdf(summaries: list[tuple[str, dict[str, Any]]], png: Path) -> bool:
    """TTFT CDFs: every workload, and the mixed workload's short requests alone."""
    panels = _panels(summaries, "ttfts", "{}", "TTFT (s)")
    panels += _panels(summaries, "short/ttft_values", "{}/short", "TTFT (s)")
    return plot_panels(panels, png)


def plot_goodput_cdf(summaries: list[tuple[str, dict[str, Any]]], png: Path) -> bool:
    """Per workload: the CDF of short requests' TTFT and of every time between tokens."""
    panels = _panels(summaries, "ttfts_short", "{}: short requests", "TTFT (s)")
    panels += _panels(summaries, "tbts", "{}: time between tokens", "TBT (s)")
    return plot_panels(panels, png)


def report(a: argparse.Namespace) -> int:
    summaries = []
    for spec in a.summaries:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        s = load_summary(Path(path))
        if not s:
            print(f"{path}: missing or empty, left out", file=sys.stderr)
            continue
        summaries.append((label or s.get("label") or Path(path).stem, s))
    if not summaries:
        return 2
    reference = load_summary(Path(a.reference)) if a.reference else None
    md = render_report(summaries, reference) + "\n" + render_goodput(summaries)
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md)
    if a.out_png:
        plot_cdf(summaries, Path(a.out_png))
    if a.out_goodput_png:
        plot_goodput_cdf(summaries, Path(a.out_goodput_png))
    return 0
