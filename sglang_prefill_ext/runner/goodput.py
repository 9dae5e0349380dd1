"""Goodput scheduling: every pass planned against a time-between-tokens (TBT) target and the waiting
requests' TTFT deadlines (DistServe's goodput, Sarathi-Serve's token budget with decodes riding).

Decodes ride every prefill pass (SGLang's mixed chunk, which the adapter turns on), so a decoding
request gets one token per pass: the pass time is its TBT. While a request decodes or a short one
waits, each pass is therefore held to a predicted forward time (`PassCost`) of `HEADROOM` x the TBT
target, the riding decode tokens counted; with SGLang's overlap scheduler that also bounds a newly
arriving short request's wait to about two and a half passes (it joins the pass after next). The
waiting short requests go first by deadline slack (target - waited - their own predicted prefill,
the least first); the chunked long prompt takes
what the budget leaves (never below `min_long_chunk`). With nobody decoding, every pass is SGLang's
full chunk unless short requests would wait behind a long prompt's chunk, so a lone prompt runs as on
stock and a burst of short requests is packed as stock packs it; `lone_pass_ms` (off by default) holds
a lone long prompt's passes to a predicted time as well, for short requests that arrive mid-prompt.

SGLang chunks one request at a time: a waiting request that would not fit whole beside the
continuing chunked one waits (the adapter's `defer`), as under the short-first budget.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from sglang_prefill_ext.runner.pass_cost import PassCost
from sglang_prefill_ext.runner.short_first import Need, PassPlan, ShortFirst

# The pass budget as a fraction of the TBT target: on the H200 pass log of the short-first run the
# measured / predicted pass time had p90 1.26 (bench/results/2026-12-01-h200-short-first.md), so a
# pass predicted at 0.75 x the target stays within it for most passes.
HEADROOM = 0.75


class Goodput(ShortFirst):
    """`ShortFirst`'s pass plan, budgeted by the TBT target whenever someone needs it."""

    def __init__(
        self,
        tbt_target_ms: float,
        short_ttft_target_ms: float,
        short_max_tokens: int,
        min_long_chunk: int,
        page_size: int,
        cost: PassCost | None = None,
        lone_pass_ms: float = 0.0,
    ) -> None:
        # window -1: the budget is always active (`plan` still runs full chunks when nobody needs it)
        super().__init__(HEADROOM * tbt_target_ms, short_max_tokens, -1.0, min_long_chunk, page_size, cost)
        self.short_ttft_target_ms = short_ttft_target_ms
        self.lone_pass_ms = lone_pass_ms
        self._seen: dict[Hashable, float] = {}

    def _order(
        self, shorts: list[tuple[Hashable, Need]], waiting: Sequence[Hashable], now: float
    ) -> list[tuple[Hashable, Need]]:
        """By deadline slack, the least first (slack only shrinks while a request waits, so none
        starves); `select` then moves as many as fit one pass of the budget to the front."""
        self._seen = {item: self._seen.get(item, now) for item in waiting}
        return sorted(shorts, key=lambda short: self.slack_ms(self._seen[short[0]], short[1], now))

    def slack_ms(self, seen: float, need: Need, now: float) -> float:
        """What is left of a short request's TTFT target after its wait and its own predicted pass."""
        own = self.cost.fixed_ms + self.cost.variable_ms(need.tokens, need.context)
        return self.short_ttft_target_ms - 1e3 * (now - seen) - own

    def plan(
        self,
        base: int,
        now: float,
        shorts: list[Need],
        long: Need | None,
        continuing: bool,
        riding: int = 0,
    ) -> PassPlan:
        """With nobody decoding (`riding`), SGLang's chunk unless a short request would share the pass with
        a long prompt's chunk (the chunked one, or the next in the queue, with more than `short_max_tokens`
        left): a pass of short requests alone packs them as stock does (16 x 512 new tokens over a cached
        32K: one pass, not five), and a long prompt alone gets it too unless `lone_pass_ms` holds its chunk
        to that predicted time. Else the budget."""
        long_prompt = long if long is not None and not self.is_short(long) else None
        if riding or (shorts and long_prompt is not None):
            return super().plan(base, now, shorts, long, continuing, riding)
        if self.lone_pass_ms > 0 and long_prompt is not None:
            chunk = self.long_chunk(self.lone_pass_ms - self.cost.fixed_ms, long_prompt.context, base)
            return PassPlan(chunk, chunk if continuing else None, budgeted=chunk < base)
        return PassPlan(base)
