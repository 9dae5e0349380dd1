"""Goodput (DistServe, OSDI 2024): requests per second that meet both a time-to-first-token target and
a time-between-tokens target, and the per-request numbers it is judged on.

Targets (issue 27's defaults, flags of bench/serving/ttft_bench.py; named, in the same units, as the
server's `--prefill-ext-*` flags that schedule for them):
- a short request (at most `short_max_tokens` uncached tokens): TTFT <= `short_ttft_target_ms`;
- a long one: TTFT <= `long_factor` x the same prompt alone on stock (`alone_s`);
- every request: its TBT p99 <= `tbt_target_ms` (a request with fewer than two output tokens has no gap).

"Alone on stock" is the cost model of stock's chunked prefill (`PassCost`, fitted to stock SGLang's
single-prompt TTFTs on the H200: 1K 0.030 s, 8K 0.213 s, 32K 1.220 s, 100K 6.720 s), summed over the
prompt's chunks of `alone_chunk` tokens after its cached prefix: one reference every variant of a run is
judged by, for any length and cache hit, without a stock pass per prompt. The report shows measured /
reference for long requests, so a run's stock `unique` and `baseline` rows check it.

Standard library only, with the extension's version-free cost model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from bench.lib.stats import percentile
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.runner.pass_cost import PassCost


@dataclasses.dataclass(frozen=True)
class Targets:
    short_max_tokens: int = PrefillExtConfig.short_max_tokens
    short_ttft_target_ms: float = PrefillExtConfig.short_ttft_target_ms
    long_factor: float = 1.5
    tbt_target_ms: float = 100.0  # the server's --prefill-ext-tbt-target-ms is off by default
    alone_cost: PassCost = PassCost()
    alone_chunk: int = 8192

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "alone_cost": str(self.alone_cost)}

    def is_short(self, uncached: int) -> bool:
        return uncached <= self.short_max_tokens

    def alone_s(self, uncached: int, cached: int) -> float:
        """Stock's TTFT for `uncached` new tokens after `cached` ones, alone: one pass per chunk."""
        ms, done = 0.0, 0
        while done < uncached:
            tokens = min(self.alone_chunk, uncached - done)
            ms += self.alone_cost.fixed_ms + self.alone_cost.variable_ms(tokens, cached + done)
            done += tokens
        return ms / 1e3

    def ttft_target_s(self, uncached: int, cached: int) -> float:
        if self.is_short(uncached):
            return self.short_ttft_target_ms / 1e3
        return self.long_factor * self.alone_s(uncached, cached)

    def loosest_ttft_target_s(self, prompt_tokens: int) -> float:
        """The most a prompt's TTFT target can be, whatever part of it turns out cached: a request past
        it without a first token has missed."""
        return max(self.short_ttft_target_ms / 1e3, self.ttft_target_s(prompt_tokens, 0))


def tbt_p99(gaps: Sequence[float]) -> float | None:
    """A request's TBT p99 (None: fewer than two output tokens)."""
    return percentile(gaps, 99)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One request against the targets."""

    short: bool
    ttft_met: bool
    tbt_met: bool
    ttft_over_alone: float  # measured TTFT / the alone-on-stock reference

    @property
    def met(self) -> bool:
        return self.ttft_met and self.tbt_met


def judge(
    prompt_tokens: int, cached_tokens: int, ttft_s: float, gaps: Sequence[float], targets: Targets
) -> Verdict:
    uncached = prompt_tokens - cached_tokens
    p99 = tbt_p99(gaps)
    alone = targets.alone_s(uncached, cached_tokens)
    return Verdict(
        short=targets.is_short(uncached),
        ttft_met=ttft_s <= targets.ttft_target_s(uncached, cached_tokens),
        tbt_met=p99 is None or p99 <= targets.tbt_target_ms / 1e3,
        ttft_over_alone=ttft_s / alone if alone > 0 else 1.0,
    )


def summarize_goodput(verdicts: Sequence[Verdict], requests: int, wall_s: float) -> dict[str, Any]:
    """`verdicts` of the requests that completed, out of `requests` sent (a failed request misses)."""
    met = sum(v.met for v in verdicts)
    short = [v for v in verdicts if v.short]
    long = [v for v in verdicts if not v.short]
    return {
        "goodput_req_s": met / wall_s if wall_s > 0 else None,
        "slo_attainment": met / requests if requests else None,
        "ttft_attainment_short": sum(v.ttft_met for v in short) / len(short) if short else None,
        "ttft_attainment_long": sum(v.ttft_met for v in long) / len(long) if long else None,
        "tbt_attainment": sum(v.tbt_met for v in verdicts) / requests if requests else None,
        "long_ttft_over_alone_p50": percentile([v.ttft_over_alone for v in long], 50),
    }
