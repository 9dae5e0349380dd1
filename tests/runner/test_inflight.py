"""The in-flight registry alone: keys, verified sharing, page alignment."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_prefill_ext.runner import InflightRegistry, Position


def tokens(*runs: range) -> np.ndarray:
    return np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in runs])


def test_waiter_sees_the_pages_a_producer_computes() -> None:
    registry = InflightRegistry(page_size=1, dedup_min_tokens=8)
    producer = tokens(range(0, 100))
    registry.add("p", Position(None, "root", producer, 0), 100)
    flight, shared = registry.shared(Position(None, "root", tokens(range(0, 60), range(500, 540)), 0))
    assert flight.producer == "p"
    assert shared == 60


def test_sharing_is_verified_token_by_token() -> None:
    registry = InflightRegistry(page_size=1, dedup_min_tokens=8)
    registry.add("p", Position(None, "root", tokens(range(0, 100)), 0), 100)
    # Same key (anchor, start, first page) but the tokens differ from the 5th on: below the minimum.
    assert registry.shared(Position(None, "root", tokens(range(0, 4), range(900, 990)), 0)) is None


@pytest.mark.parametrize(
    ("namespace", "anchor", "start"), [("other", "root", 0), (None, "node", 0), (None, "root", 16)]
)
def test_other_namespace_anchor_or_start_is_not_shared(
    namespace: str | None, anchor: str, start: int
) -> None:
    registry = InflightRegistry(page_size=16, dedup_min_tokens=16)
    data = tokens(range(0, 256))
    registry.add("p", Position(None, "root", data, 0), 256)
    assert registry.shared(Position(namespace, anchor, data, start)) is None


def test_flights_cover_whole_pages_only() -> None:
    registry = InflightRegistry(page_size=16, dedup_min_tokens=16)
    data = tokens(range(0, 100))
    flight = registry.add("p", Position(None, "root", data, 0), 100)
    assert (flight.start, flight.end) == (0, 96)
    assert registry.add("q", Position(None, "root", data, 8), 100) is None  # unaligned start
    assert registry.add("r", Position(None, "root", data, 96), 100) is None  # less than one page
    assert registry.shared(Position(None, "root", tokens(range(0, 50), range(700, 760)), 0))[1] == 48


def test_a_producer_has_one_flight_and_drop_forgets_it() -> None:
    registry = InflightRegistry(page_size=1, dedup_min_tokens=1)
    data = tokens(range(0, 64))
    registry.add("p", Position(None, "root", data, 0), 32)
    registry.add("p", Position(None, "mid", data, 32), 64)  # the next chunk replaces the last
    assert len(registry) == 1
    assert registry.shared(Position(None, "root", data, 0)) is None
    assert registry.shared(Position(None, "mid", data, 32))[1] == 32
    registry.drop("p")
    assert len(registry) == 0
    assert registry.shared(Position(None, "mid", data, 32)) is None


def test_the_longest_of_several_flights_wins() -> None:
    registry = InflightRegistry(page_size=1, dedup_min_tokens=1)
    registry.add("short", Position(None, "root", tokens(range(0, 10), range(800, 900)), 0), 110)
    registry.add("long", Position(None, "root", tokens(range(0, 80), range(900, 930)), 0), 110)
    flight, shared = registry.shared(Position(None, "root", tokens(range(0, 100)), 0))
    assert (flight.producer, shared) == ("long", 80)
