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

from sglang_prefill_ext.runner.pass_cost import PassCost


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
