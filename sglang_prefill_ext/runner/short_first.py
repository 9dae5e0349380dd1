"""Short requests first: a latency budget per prefill pass while short requests arrive.

SGLang 0.5.17 chunks one long prompt at a time and gives each of its chunks the pass's whole token
budget (`--chunked-prefill-size`), so a short request that arrives meanwhile waits for every
remaining chunk of it. A smaller chunk size alone does not help: the long request still takes the
whole (smaller) budget of every pass until it is done.

Here, while short requests (at most `short_max_tokens` uncached tokens) arrive (one was seen within
`window_s`), every pass is sized to a latency budget from a cost model of forward time, not a token
count (Sarathi-Serve's idea): waiting short requests go first in the queue and ride the next pass,
and the long prompt's chunk takes what the budget leaves, never less than `min_long_chunk` (so it
keeps progressing). With SGLang's
overlap scheduler a request that arrives while pass k runs is admitted to pass k + 2 (k + 1 was
formed before it arrived), so its time to first token is about half a pass plus two passes.
Without short traffic every pass keeps the stock chunk size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, MutableSequence, Sequence


@dataclasses.dataclass(frozen=True)
class PassCost:
    """Predicted forward time of one prefill pass: a fixed cost, a cost per new token, and a cost
    per (new token, context token) pair of causal attention.

    Defaults fitted to stock SGLang 0.5.17 TTFTs on the H200 (8B-shaped model, fa3, chunks of 8192):
    1K 0.030 s, 8K 0.213 s, 32K 1.220 s, 100K 6.720 s (bench/results/2026-12-01-h200-short-first.md
    compares them with the per-pass trace)."""

    fixed_ms: float = 5.0
    token_us: float = 22.0
    pair_ps: float = 890.0

    @classmethod
    def parse(cls, text: str) -> PassCost:
        """`FIXED_MS,TOKEN_US,PAIR_PS`, e.g. `5,22,890`."""
        parts = text.split(",")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 3 or min(values) < 0:
            raise ValueError("expected FIXED_MS,TOKEN_US,PAIR_PS (three numbers >= 0)")
        return cls(*values)

    def __str__(self) -> str:
        """The `FIXED_MS,TOKEN_US,PAIR_PS` text `parse` reads (six significant digits each)."""
        return f"{self.fixed_ms:g},{self.token_us:g},{self.pair_ps:g}"

    def variable_ms(self, tokens: int, context: int) -> float:
        """Time `tokens` new tokens after `context` cached ones add to a pass (the fixed cost aside)."""
        pairs = tokens * context + tokens * tokens / 2
        return tokens * self.token_us * 1e-3 + pairs * self.pair_ps * 1e-9

    def tokens_within(self, ms: float, context: int) -> int:
        """The most new tokens after `context` cached ones whose variable time fits in `ms`."""
        if ms <= 0:
            return 0
        a = self.pair_ps * 1e-9 / 2
        b = self.token_us * 1e-3 + self.pair_ps * 1e-9 * context
        if a == 0:
            return int(ms / b) if b > 0 else 1 << 40
        return int((-b + math.sqrt(b * b + 4 * a * ms)) / (2 * a))


@dataclasses.dataclass(frozen=True)
class Need:
    """A waiting request's uncached tokens and the cached context they attend to."""

    tokens: int
    context: int


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """This pass's token budget (`chunk`: SGLang's chunked-prefill size for the pass), the cap on
    the continuing chunked request's chunk (None: SGLang's own), and whether the latency budget set
    them (`budgeted`) or SGLang's chunk size stands."""

    chunk: int
    long_cap: int | None = None
    budgeted: bool = False


@dataclasses.dataclass
class ShortFirstCounters:
    budgeted_passes: int = 0
    shortened_chunks: int = 0
    yielded_tokens: int = 0


class ShortFirst:
    """The per-pass decisions: which waiting requests are short, their order, the pass budget."""

    def __init__(
        self,
        budget_ms: float,
        short_max_tokens: int,
        window_s: float,
        min_long_chunk: int,
        page_size: int,
        cost: PassCost | None = None,
    ) -> None:
        self.budget_ms = budget_ms
        self.short_max_tokens = short_max_tokens
        self.window_s = window_s
        self.min_long_chunk = max(min_long_chunk, page_size)
        self.page_size = page_size
        self.cost = cost or PassCost()
        self.counters = ShortFirstCounters()
        self._last_short = -math.inf

    @property
    def enabled(self) -> bool:
        return self.budget_ms > 0

    def is_short(self, need: Need) -> bool:
        return need.tokens <= self.short_max_tokens

    def select(
        self, waiting: MutableSequence[Hashable], need: Callable[[Hashable], Need], now: float
    ) -> list[Need]:
        """Move the waiting short requests that fit in one pass of the budget together (the first
        always) to the front of `waiting`, in `_order`'s order; returns their needs. Seeing a short
        request starts or extends the short-traffic window."""
        if not self.enabled:
            return []
        needs = [(item, need(item)) for item in waiting]
        shorts = self._order([(item, n) for item, n in needs if self.is_short(n)], waiting, now)
        if shorts:
            self._last_short = now
        left = self.budget_ms - self.cost.fixed_ms
        chosen: list[tuple[Hashable, Need]] = []
        for item, n in shorts:
            ms = self.cost.variable_ms(n.tokens, n.context)
            if chosen and ms > left:
                break
            left -= ms
            chosen.append((item, n))
        if chosen:
            ids = {id(item) for item, _ in chosen}
            waiting[:] = [item for item, _ in chosen] + [item for item in waiting if id(item) not in ids]
        return [n for _, n in chosen]

    def _order(
        self, shorts: list[tuple[Hashable, Need]], waiting: Sequence[Hashable], now: float
    ) -> list[tuple[Hashable, Need]]:
        """The order the waiting short requests go in: the queue's."""
        return shorts

    def active(self, now: float) -> bool:
        """Within short traffic (always, with a negative window)."""
        return self.enabled and (self.window_s < 0 or now - self._last_short <= self.window_s)

    def plan(
        self,
        base: int,
        now: float,
        shorts: list[Need],
        long: Need | None,
        continuing: bool,
        riding: int = 0,
    ) -> PassPlan:
        """The pass's budget: `base` (SGLang's chunk size) outside short traffic; within it, the
        `shorts` that `select` put first plus a long chunk filling the rest of the budget.

        `long`: the request this pass chunks (remaining tokens, context), if any; `continuing`: it is
        SGLang's chunked request, added before the queue (its chunk gets the cap); `riding`: decode
        tokens of running requests in the same pass (SGLang's mixed chunk), their time off the budget."""
        if not self.active(now):
            return PassPlan(base)
        left = (
            self.budget_ms
            - self.cost.fixed_ms
            - self.cost.variable_ms(riding, 0)
            - sum(self.cost.variable_ms(n.tokens, n.context) for n in shorts)
        )
        short_tokens = sum(self._paged(n.tokens) for n in shorts)
        long_tokens = self.long_chunk(left, long.context if long is not None else 0, base)
        self.counters.budgeted_passes += 1
        if long is not None and long_tokens < min(long.tokens, base):
            self.counters.shortened_chunks += 1
            self.counters.yielded_tokens += min(long.tokens, base) - long_tokens
        chunk = short_tokens + long_tokens
        return PassPlan(chunk, long_tokens if continuing else None, budgeted=True)

    def long_chunk(self, ms: float, context: int, base: int) -> int:
        """A long prompt's chunk after `context` tokens in `ms` of predicted variable time: whole pages,
        at least `min_long_chunk`, at most `base`."""
        fill = self.cost.tokens_within(ms, context) // self.page_size * self.page_size
        return min(max(fill, self.min_long_chunk), base)

    def _paged(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size
