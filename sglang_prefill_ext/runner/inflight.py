"""In-flight dedup registry: the page ranges scheduled or chunked requests are computing right now.

A flight is keyed like the tree: the namespace (SGLang's extra_key), the anchor (the tree node its
range starts after, i.e. where the producer's match ended), the start position and the first page
of tokens. A waiting request whose own match ends at the same anchor asks how many of its next
tokens the flight covers; the answer is verified token by token, so a lookup never trusts a hash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterator

import numpy as np

from sglang_prefill_ext.radix.tokens import common_prefix_len

FlightKey = tuple[Hashable, Hashable, int, bytes]


@dataclasses.dataclass(frozen=True)
class Position:
    """A point in a prompt as the tree sees it: `tokens[:start]` matched, ending at node `anchor`."""

    namespace: Hashable
    anchor: Hashable
    tokens: np.ndarray
    start: int

    def key(self, page_size: int) -> FlightKey:
        page = self.tokens[self.start : self.start + page_size].tobytes()
        return (self.namespace, self.anchor, self.start, page)


@dataclasses.dataclass(frozen=True)
class Flight:
    """`producer` computes tokens [start, end) (page-aligned) after `anchor`; `tokens` holds them."""

    producer: Hashable
    namespace: Hashable
    anchor: Hashable
    start: int
    end: int
    tokens: bytes

    @property
    def length(self) -> int:
        return self.end - self.start


class InflightRegistry:
    """At most one flight per producer (a chunked request's current chunk replaces its last)."""

    def __init__(self, page_size: int, dedup_min_tokens: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.dedup_min_tokens = max(dedup_min_tokens, page_size)
        self._by_key: dict[FlightKey, list[Flight]] = {}
        self._by_producer: dict[Hashable, tuple[FlightKey, Flight]] = {}

    def __len__(self) -> int:
        return len(self._by_producer)

    def __iter__(self) -> Iterator[Flight]:
        return iter([flight for _, flight in self._by_producer.values()])

    def add(self, producer: Hashable, at: Position, end: int) -> Flight | None:
        """Record that `producer` computes `at.tokens[at.start:end]`; whole pages from a page boundary."""
        self.drop(producer)
        start = at.start
        end = min(end, len(at.tokens)) // self.page_size * self.page_size
        if start % self.page_size or end - start < self.page_size:
            return None
        flight = Flight(producer, at.namespace, at.anchor, start, end, at.tokens[start:end].tobytes())
        key = at.key(self.page_size)
        self._by_key.setdefault(key, []).append(flight)
        self._by_producer[producer] = (key, flight)
        return flight

    def drop(self, producer: Hashable) -> Flight | None:
        entry = self._by_producer.pop(producer, None)
        if entry is None:
            return None
        key, flight = entry
        flights = self._by_key[key]
        flights.remove(flight)
        if not flights:
            del self._by_key[key]
        return flight

    def shared(self, at: Position) -> tuple[Flight, int] | None:
        """The flight covering the most of `at.tokens[at.start:]` (whole pages, at least the minimum)."""
        if at.start % self.page_size:
            return None
        flights = self._by_key.get(at.key(self.page_size))
        if not flights:
            return None
        tokens, start = at.tokens, at.start
        best: tuple[Flight, int] | None = None
        for flight in flights:
            limit = min(flight.length, len(tokens) - start)
            same = common_prefix_len(flight.tokens, 0, tokens[start : start + limit], limit)
            same -= same % self.page_size
            if same >= self.dedup_min_tokens and (best is None or same > best[1]):
                best = (flight, same)
        return best
