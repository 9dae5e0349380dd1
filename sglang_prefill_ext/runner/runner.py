"""The per-pass protocol between a version's scheduler adapter and the runner's decisions.

Each scheduling pass the adapter calls, in order:

1. `begin_pass(waiting, landed)`: drops flights whose producer landed its pages in the tree (or
   stopped: finished, aborted, retracted), counts one more pass for every waiting request.
2. `order(waiting, stamp, match)` (lpm-aging only): refreshes stale matches, sorts; then, in the
   final order, `protect(waiting, stamp, match, touch)`: marks every waiting request's matched
   prefix used, the queue's tail first, so recency-based eviction takes the prefixes the scheduler
   will reach last and never the queue head's.
3. for each candidate the scheduler would admit: `should_defer(item, position)`: True while the next
   uncached pages of `item` are in flight (the scheduler skips it this pass).
4. `track(producer, ...)` for every request admitted (including a continuing chunked one), right
   when it is admitted, so the next candidate of the same pass already sees it.

Progress: a deferred request waits on a flight, and flights only exist for requests the scheduler
has just put into a batch; the batch runs, so the flight lands (or its producer stops) within a
bounded number of passes and is dropped in `begin_pass`. `dedup_max_wait_passes` bounds the wait even if
an adapter never reports the landing: past it, the request computes the pages itself.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Mapping, MutableSequence, Sequence
from types import MappingProxyType

from sglang_prefill_ext.runner.inflight import Flight, InflightRegistry, Position
from sglang_prefill_ext.runner.waiting import WaitState, lpm_aging_key


@dataclasses.dataclass
class RunnerCounters:
    passes: int = 0
    deferrals: int = 0
    dedup_tokens: int = 0
    dedup_timeouts: int = 0
    flights: int = 0
    landed: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class PrefillRunner:
    def __init__(
        self,
        page_size: int,
        dedup: bool = True,
        dedup_min_tokens: int = 64,
        dedup_max_wait_passes: int = 256,
        max_wait_passes: int = 32,
        protect_waiting: bool = True,
    ) -> None:
        self.dedup = dedup
        self.protect_waiting = protect_waiting
        self.dedup_max_wait_passes = dedup_max_wait_passes
        self.max_wait_passes = max_wait_passes
        self.flights = InflightRegistry(page_size, dedup_min_tokens)
        self.counters = RunnerCounters()
        self._states: dict[Hashable, WaitState] = {}
        self._arrivals = itertools.count()

    def state(self, item: Hashable) -> WaitState:
        state = self._states.get(item)
        if state is None:
            state = self._states[item] = WaitState(next(self._arrivals))
        return state

    def waiting_states(self) -> Mapping[Hashable, WaitState]:
        """Read-only: what the runner keeps for each request waiting at the last `begin_pass`."""
        return MappingProxyType(self._states)

    def deduped_tokens(self, item: Hashable) -> int:
        """In-flight tokens `item` waited for (0 if it never waited), while it is still tracked."""
        state = self._states.get(item)
        return state.deduped_tokens if state is not None else 0

    def begin_pass(self, waiting: Sequence[Hashable], landed: Callable[[Flight], bool]) -> None:
        self.counters.passes += 1
        for flight in list(self.flights):
            if landed(flight):
                self.flights.drop(flight.producer)
                self.counters.landed += 1
        # Requests that left the queue (admitted, aborted) forget their state.
        self._states = {item: self.state(item) for item in waiting}
        for state in self._states.values():
            state.passes += 1

    def order(
        self,
        waiting: MutableSequence[Hashable],
        stamp: Callable[[Hashable], Hashable],
        match: Callable[[Hashable], int],
    ) -> None:
        """Sort `waiting` in place (lpm-aging).

        `stamp(item)` changes whenever `item`'s match could have changed since it was taken (read
        right after `match(item)`, which re-matches); items with an unchanged stamp are not re-matched.
        """
        self.refresh(waiting, stamp, match)
        keys = {item: lpm_aging_key(self.state(item), self.max_wait_passes) for item in waiting}
        waiting.sort(key=keys.__getitem__)

    def refresh(
        self,
        waiting: Sequence[Hashable],
        stamp: Callable[[Hashable], Hashable],
        match: Callable[[Hashable], int],
    ) -> None:
        """Re-match the items whose stamp changed since their last match (or that were never matched)."""
        for item in waiting:
            state = self.state(item)
            if state.stamp is None or state.stamp != stamp(item):
                state.matched = match(item)
                state.stamp = stamp(item)

    def protect(
        self,
        waiting: Sequence[Hashable],
        stamp: Callable[[Hashable], Hashable],
        match: Callable[[Hashable], int],
        touch: Callable[[Hashable], None],
    ) -> None:
        """`touch(item)` (mark its matched prefix used now) for every item of `waiting`, last first.

        The queue order is the scheduler's known future: the head is admitted first. Without this,
        the request that waited longest holds the least recently used prefix, so LRU evicts exactly
        the context admitted next (under a pool smaller than the working set, every recomputed
        context token of the replay's multi-turn trace was evicted while its request waited).
        """
        if not self.protect_waiting:
            return
        self.refresh(waiting, stamp, match)
        for item in reversed(waiting):
            touch(item)

    def should_defer(self, item: Hashable, at: Position) -> bool:
        """True when `item`'s first uncached pages (from `at`) are being computed right now."""
        if not self.dedup or not len(self.flights):
            return False
        found = self.flights.shared(at)
        if found is None:
            return False
        state = self.state(item)
        if state.dedup_passes >= self.dedup_max_wait_passes:
            self.counters.dedup_timeouts += 1
            return False
        state.dedup_passes += 1
        state.deduped_tokens = max(state.deduped_tokens, found[1])
        self.counters.deferrals += 1
        return True

    def track(self, producer: Hashable, at: Position, end: int) -> Flight | None:
        """`producer` was admitted to compute its tokens from `at` to `end`."""
        if not self.dedup:
            return None
        self.counters.dedup_tokens += self.deduped_tokens(producer)
        flight = self.flights.add(producer, at, end)
        if flight is not None:
            self.counters.flights += 1
        return flight
