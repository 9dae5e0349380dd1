"""The doctor's report: hit rates, the divergence map and the findings, as a dict (`--json`) and as text."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from sglang_prefill_ext.doctor import layout
from sglang_prefill_ext.doctor.analysis import PATTERNS, Verdict, diagnose, saved_ms
from sglang_prefill_ext.doctor.log import Log, Request
from sglang_prefill_ext.runner.pass_cost import PassCost

LENGTH_BUCKETS = (1024, 4096, 16384, 65536)  # prompt-length bucket edges, tokens
TIME_WINDOWS = 20
MAP_ROWS = 5
SHARES_MOST = 0.5  # the divergence map's prompts: those sharing at least this fraction of their tokens

NON_PREFIX = "non_prefix"
KINDS = (*PATTERNS, NON_PREFIX)  # the findings' kinds
WHAT = {
    "dynamic": "content that differs in every request near the front (a timestamp, request id, user profile), "
    "before content the cache holds",
    "reordered": "the same documents in other orders (retrieved documents in no fixed order)",
    "changed_prefix": "a shared prefix that changed (a system prompt or document edited), the rest of it unchanged",
    "evicted": "prefixes evicted before they were reused",
    NON_PREFIX: "chunks seen before at other positions or in other combinations, not recoverable by layout",
}
FIX = {
    "dynamic": "move the part that changes after the shared content (the end of the prompt)",
    "reordered": "keep shared documents in one stable order (the order first seen), in front of what differs",
    "changed_prefix": "keep the part that changes after the shared prefix",
    "evicted": "a larger KV pool (--mem-fraction-static), or fewer prompts in flight",
    NON_PREFIX: "reuse chunks at any position: --prefill-ext-blend, each request marking its chunks "
    "(chunk_spans; CacheBlend-style, SGLang 0.5.17: docs/BLEND.md); no layout change recovers them",
}
# Whether the cost comes back with every request that has the pattern, or was paid once per change.
ONE_TIME = {"changed_prefix"}


def _bucket(length: int) -> str:
    edges = [0, *LENGTH_BUCKETS]
    for lo, hi in zip(edges, LENGTH_BUCKETS, strict=False):
        if length < hi:
            return f"{lo // 1024}K-{hi // 1024}K" if lo else f"<{hi // 1024}K"
    return f">={LENGTH_BUCKETS[-1] // 1024}K"


def _rate(cached: int, total: int) -> float | None:
    return round(cached / total, 4) if total else None


def _by_length(requests: list[Request]) -> list[dict[str, Any]]:
    rows: dict[str, list[int]] = {}
    for r in sorted(requests, key=lambda r: r.input_len):
        row = rows.setdefault(_bucket(r.input_len), [0, 0, 0])
        row[0] += 1
        row[1] += r.input_len
        row[2] += r.cached
    return [
        {"prompt_length": name, "requests": n, "prompt_tokens": t, "hit_rate": _rate(c, t)}
        for name, (n, t, c) in rows.items()
    ]


def _over_time(requests: list[Request]) -> list[float | None]:
    """The hit rate of consecutive windows of requests, in the order their prefill started."""
    windows = min(TIME_WINDOWS, len(requests))
    rates = []
    for w in range(windows):
        part = requests[w * len(requests) // windows : (w + 1) * len(requests) // windows]
        rates.append(_rate(sum(r.cached for r in part), sum(r.input_len for r in part)))
    return rates


def _divergence(verdicts: list[Verdict], block: int) -> dict[str, Any]:
    """Where prompts sharing most of their tokens with the cache stop sharing (the block it falls in)."""
    sharing = [
        v for v in verdicts if v.hit_end + v.seen >= SHARES_MOST * v.input_len and v.hit_end < v.input_len
    ]
    at = collections.Counter(v.hit_end // block * block for v in sharing)
    example = {v.hit_end // block * block: v for v in reversed(sharing)}
    return {
        "positions": [v.hit_end for v in sharing],
        "top": [
            {
                "offset": offset,
                "requests": n,
                "example": example[offset].rid,
                "example_offset": example[offset].hit_end,
            }
            for offset, n in at.most_common(MAP_ROWS)
        ],
    }


def _tokens(kind: str, v: Verdict) -> int:
    return v.non_prefix if kind == NON_PREFIX else v.saved if v.pattern == kind else 0


def _net(kind: str, log: list[Verdict]) -> int:
    """What the fix of `kind` changes over the whole log: its requests' savings, and for a re-run fix
    (`layout.FIXES`) its gains and losses on the requests no pattern claims."""
    total = sum(_tokens(kind, v) for v in log)
    if kind in layout.FIXES:
        total += sum(v.gains[kind] for v in log if v.pattern is None)
    return total


def _finding(kind: str, log: Path, verdicts: list[Verdict], cost: PassCost) -> dict[str, Any]:
    having = [v for v in verdicts if _tokens(kind, v) > 0]
    tokens = _net(kind, verdicts)
    gross = sum(_tokens(kind, v) for v in having)
    gpu_ms = sum(saved_ms(v, _tokens(kind, v), cost) for v in having) * tokens / gross
    example = max(having, key=lambda v: _tokens(kind, v))
    finding: dict[str, Any] = {
        "log": str(log),
        "pattern": kind,
        "what": WHAT[kind],
        "fix": FIX[kind],
        "requests": len(having),
        "of_requests": len(verdicts),
        "tokens": tokens,
        "gpu_s": round(gpu_ms / 1e3, 3),
        "example": {"rid": example.rid, "diverges_at": example.hit_end},
    }
    if kind in ONE_TIME:
        finding["cost"] = "one-time"
        finding["changes"] = len({v.change for v in having})
    else:
        finding["cost"] = "recurring"
    if kind in ("reordered", NON_PREFIX) and example.moved_from is not None:
        finding["example"].update(found_at=example.moved_to, earlier_at=example.moved_from)
    elif kind in ("dynamic", "changed_prefix") and example.resumes_at is not None:
        finding["example"]["shared_again_from"] = example.resumes_at
    elif kind == "evicted":
        pools = sorted(v.keep_pool for v in having)
        finding["keep_pool_tokens"] = {"all": pools[-1], "p50": pools[len(pools) // 2]}
    return finding


def _findings(log: Log, verdicts: list[Verdict], cost: PassCost) -> list[dict[str, Any]]:
    block = log.requests[0].fp.block if verdicts else 0  # type: ignore[union-attr]
    return [
        _finding(kind, log.path, verdicts, cost)
        for kind in KINDS
        if any(_tokens(kind, v) > 0 for v in verdicts) and _net(kind, verdicts) >= block
    ]


def _blend(requests: list[Request]) -> dict[str, int] | None:
    """What chunk blending did (None: no request was blended): of the chunk tokens past the prefix
    cache's match, those reused from the chunk store (recovered), those recomputed in the chunks
    reused (the ratio's heads), and those computed in chunks the store missed or a request computed
    whole."""
    blended = [r.blend for r in requests if r.blend is not None]
    if not blended:
        return None
    chunk, reused, recomputed = (
        sum(getattr(b, f) for b in blended) for f in ("chunk_tokens", "reused_tokens", "recomputed_tokens")
    )
    return {
        "requests": len(blended),
        "hits": sum(b.hits for b in blended),
        "chunk_tokens": chunk,
        "reused_tokens": reused,
        "recomputed_tokens": recomputed,
        "computed_tokens": chunk - reused - recomputed,
    }


def build(logs: list[Log], cost: PassCost) -> dict[str, Any]:
    """The report over every log given (each one server's cache); each finding names its log."""
    requests = [r for log in logs for r in log.requests]
    by_log = [diagnose(log.requests, log.flushes) for log in logs]
    verdicts = [v for log in by_log for v in log]
    blocks = {r.fp.block for r in requests if r.fp is not None}
    block = min(blocks) if blocks else 0
    prompt_tokens = sum(r.input_len for r in requests)
    findings = [f for log, found in zip(logs, by_log, strict=True) for f in _findings(log, found, cost)]
    return {
        "logs": [str(log.path) for log in logs],
        "requests": len(requests),
        "aborted": sum(log.aborted for log in logs),
        "skipped_lines": {str(log.path): log.skipped for log in logs if log.skipped},
        "flushes": sum(len(log.flushes) for log in logs),
        "fingerprinted": len(verdicts),
        "fingerprint_block": block or None,
        "pass_cost": str(cost),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": sum(r.cached for r in requests),
        "hit_rate": _rate(sum(r.cached for r in requests), prompt_tokens),
        "by_length": _by_length(requests),
        "hit_rate_over_time": {str(log.path): _over_time(log.requests) for log in logs},
        "blend": _blend(requests),
        "divergence": _divergence(verdicts, block) if verdicts else {"positions": [], "top": []},
        "findings": sorted(findings, key=lambda f: -f["tokens"]),
    }


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f} %"


def text(report: dict[str, Any]) -> str:
    lines = [
        f"cache doctor: {len(report['logs'])} log(s), {report['requests']:,} finished requests"
        f" ({report['aborted']} aborted left out), {report['fingerprinted']:,} with fingerprints",
        f"hit rate: {_pct(report['hit_rate'])} of {report['prompt_tokens']:,} prompt tokens",
        "  by prompt length: "
        + " | ".join(
            f"{row['prompt_length']} {_pct(row['hit_rate'])} (n={row['requests']})"
            for row in report["by_length"]
        ),
    ]
    blend = report["blend"]
    if blend is not None:
        lines.append(
            f"chunk blending: {blend['requests']:,} requests, {blend['chunk_tokens']:,} chunk tokens past the"
            f" prefix cache's match: {blend['reused_tokens']:,} reused from the chunk store ({blend['hits']:,}"
            f" chunks), {blend['recomputed_tokens']:,} recomputed in the chunks reused,"
            f" {blend['computed_tokens']:,} computed in chunks not reused (missed, or computed whole)"
        )
    if not report["fingerprinted"]:
        lines.append(
            "no fingerprints in the log: serve with --prefill-ext-log-fingerprints to find why prompts miss"
        )
        return "\n".join(lines)
    lines.append(
        "divergence map (prompts sharing most of their tokens with the cache, where they stop sharing):"
    )
    for row in report["divergence"]["top"]:
        lines.append(
            f"  token {row['offset']:,}: {row['requests']} requests (e.g. {row['example']} at {row['example_offset']:,})"
        )
    if not report["findings"]:
        lines.append("findings: none, the prompts reuse what the cache could give them")
        return "\n".join(lines)
    lines.append(
        f"findings (savings estimated at fingerprint-block granularity; GPU time from --prefill-ext-pass-cost {report['pass_cost']}):"
    )
    for n, f in enumerate(report["findings"], 1):
        example = ", ".join(
            f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in f["example"].items()
        )
        lines.append(
            f"  {n}. {f['log']}: {f['what']}: {f['requests']} of {f['of_requests']} requests,"
            f" {f['tokens']:,} prefill tokens recomputed"
        )
        lines.append(f"     e.g. {example}")
        if f["cost"] == "one-time":
            lines.append(
                f"     one-time: paid once after each change ({f['changes']} seen), not by every request"
            )
        else:
            lines.append("     recurring: paid again by every request laid out this way")
        if "keep_pool_tokens" in f:
            pools = f["keep_pool_tokens"]
            lines.append(
                f"     a KV pool of {pools['all']:,} tokens would have kept all of them ({pools['p50']:,}: half), an LRU estimate"
            )
        saves = "would save" if f["pattern"] == NON_PREFIX else "saves"
        lines.append(f"     fix: {f['fix']}: {saves} {f['tokens']:,} prefill tokens, ~{f['gpu_s']:.2f} GPU s")
    return "\n".join(lines)
