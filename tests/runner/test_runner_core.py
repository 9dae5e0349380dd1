"""The version-free runner: deferral until landing, its safety bound, and lpm-aging's bound."""

from __future__ import annotations

import numpy as np

from sglang_prefill_ext.runner import Flight, Position, PrefillRunner

SHARED = np.arange(0, 512, dtype=np.int64)


def prompt(own: int) -> np.ndarray:
    return np.concatenate([SHARED, np.full(32, 10_000 + own, dtype=np.int64)])


def test_waiter_defers_until_the_flight_lands_then_proceeds() -> None:
    runner = PrefillRunner(page_size=1)
    landed: set[str] = set()

    def has_landed(flight: Flight) -> bool:
        return flight.producer in landed

    runner.begin_pass(["a", "b"], has_landed)
    assert not runner.should_defer("a", Position(None, "root", prompt(0), 0))
    runner.track("a", Position(None, "root", prompt(0), 0), 544)
    assert runner.should_defer("b", Position(None, "root", prompt(1), 0))
    runner.begin_pass(["b"], has_landed)  # a's batch has not landed yet (overlap)
    assert runner.should_defer("b", Position(None, "root", prompt(1), 0))
    landed.add("a")
    runner.begin_pass(["b"], has_landed)
    assert not runner.should_defer("b", Position(None, "root", prompt(1), 0))
    assert runner.state("b").deduped_tokens == 512
    runner.track("b", Position(None, "root", prompt(1), 0), 544)
    assert runner.counters.as_dict() | {"passes": 0} == {
        "passes": 0,
        "deferrals": 2,
        "dedup_tokens": 512,
        "dedup_timeouts": 0,
        "flights": 2,
        "landed": 1,
    }


def test_a_flight_that_never_lands_is_waited_on_a_bounded_number_of_passes() -> None:
    runner = PrefillRunner(page_size=1, dedup_max_wait_passes=3)
    runner.begin_pass(["a", "b"], lambda flight: False)
    runner.track("a", Position(None, "root", prompt(0), 0), 544)
    deferred = 0
    while runner.should_defer("b", Position(None, "root", prompt(1), 0)):
        deferred += 1
        runner.begin_pass(["b"], lambda flight: False)
    assert deferred == 3
    assert runner.counters.dedup_timeouts == 1


def test_dedup_off_never_defers() -> None:
    runner = PrefillRunner(page_size=1, dedup=False)
    runner.begin_pass(["a", "b"], lambda flight: False)
    runner.track("a", Position(None, "root", prompt(0), 0), 544)
    assert not runner.should_defer("b", Position(None, "root", prompt(1), 0))


def test_lpm_aging_admits_a_starved_request_within_the_bound() -> None:
    """One admission per pass, a newcomer with a long match every pass: pure LPM would starve `old`."""
    max_wait = 5
    runner = PrefillRunner(page_size=1, max_wait_passes=max_wait)
    matches = {"old": 0}
    waiting = ["old"]
    for step in range(50):
        newcomer = f"n{step}"
        matches[newcomer] = 1000
        waiting.append(newcomer)
        runner.begin_pass(waiting, lambda flight: False)
        runner.order(waiting, stamp=lambda item: 0, match=matches.__getitem__)
        admitted = waiting.pop(0)
        if admitted == "old":
            break
    assert admitted == "old"
    assert step + 1 <= max_wait


def test_lpm_aging_rematches_only_when_the_stamp_changed() -> None:
    runner = PrefillRunner(page_size=1)
    calls: list[str] = []

    def match(item: str) -> int:
        calls.append(item)
        return {"a": 1, "b": 2}[item]

    waiting = ["a", "b"]
    runner.begin_pass(waiting, lambda flight: False)
    stamps = {"a": 1, "b": 1}
    runner.order(waiting, stamp=stamps.__getitem__, match=match)
    assert waiting == ["b", "a"]
    runner.order(waiting, stamp=stamps.__getitem__, match=match)
    assert calls == ["a", "b"]
    stamps["a"] = 2
    runner.order(waiting, stamp=stamps.__getitem__, match=match)
    assert calls == ["a", "b", "a"]


def test_protect_touches_the_queue_tail_first_and_matches_only_stale_items() -> None:
    """The head is touched last (most recently used), so recency-based eviction takes it last."""
    matched: list[str] = []
    touched: list[str] = []
    stamps = {"a": 1, "b": 1, "c": 1}

    def match(item: str) -> int:
        matched.append(item)
        return 0

    for protect, expected in ((True, ["c", "b", "a"]), (False, [])):
        matched.clear()
        touched.clear()
        runner = PrefillRunner(page_size=1, protect_waiting=protect)
        runner.begin_pass(["a", "b", "c"], lambda flight: False)
        runner.protect(["a", "b", "c"], stamps.__getitem__, match, touched.append)
        assert touched == expected
        assert matched == expected[::-1]
    runner = PrefillRunner(page_size=1)
    runner.begin_pass(["a", "b", "c"], lambda flight: False)
    runner.order(["a", "b", "c"], stamps.__getitem__, match)
    matched.clear()
    stamps["b"] = 2
    runner.protect(["a", "b", "c"], stamps.__getitem__, match, touched.append)
    assert matched == ["b"]
