"""Goodput capacity (DistServe, OSDI 2024): the highest request rate at which at least `goal` of the
requests meet their targets (`bench/lib/goodput.py`), found by a sweep of load factors (multiples of
a workload's base rate), the same way on a server (bench/serving/capacity.py) and in the CPU replay
(bench/replay/capacity_replay.py).

The sweep goes from the highest factor down and ends `below` factors after the first that meets the
goal: an overloaded point is quick (it fails as soon as its certain misses exceed what the goal
allows, `Sweep.miss_budget`), a lightly loaded one is slow (its requests arrive slowly), so the
factors under the capacity that add nothing to it are not run.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

# Why a point ended before all its requests had completed.
STOPPED_MISSES = "misses"  # more certain misses than the goal allows: it fails whatever the rest does
STOPPED_TIMEOUT = "timeout"  # past its time limit; the requests not completed count as misses


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of a workload at `factor` x its base rate (`rate` in the workload's unit) with `seed`:
    `met` of `planned` requests met both targets (`shorts` of them short); `stopped`: why it ended
    early, if it did."""

    factor: float
    rate: float
    seed: int
    planned: int
    met: int
    shorts: int
    completed: int
    stopped: str | None = None
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def attainment(points: Iterable[Point]) -> float:
    """Met over planned, pooled over `points` (a rate's seeds)."""
    points = list(points)
    planned = sum(p.planned for p in points)
    return sum(p.met for p in points) / planned if planned else 0.0


def by_factor(points: Iterable[Point]) -> dict[float, list[Point]]:
    """`points` by load factor, highest first."""
    out: dict[float, list[Point]] = {}
    for p in points:
        out.setdefault(p.factor, []).append(p)
    return dict(sorted(out.items(), reverse=True))


def passes(points: Sequence[Point], goal: float, seeds: int) -> bool:
    """A factor meets the goal: every seed ran to the end and the pooled attainment reaches it."""
    return len(points) == seeds and not any(p.stopped for p in points) and attainment(points) >= goal


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The highest factor meeting the goal (0: none of those run) and the lowest failing one above it
    (None: none failed above); `rate` is `factor` in the workload's unit."""

    factor: float
    rate: float
    failing_factor: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def capacity(points: Iterable[Point], goal: float, seeds: int, base_rate: float) -> Capacity:
    groups = by_factor(points)
    passing = [f for f, ps in groups.items() if passes(ps, goal, seeds)]
    best = max(passing, default=0.0)
    above = [f for f in groups if f > best and f not in passing]
    return Capacity(best, best * base_rate, min(above, default=None))


class Sweep:
    """Which (factor, seed) runs next, and how many certain misses its point may see before it fails.

    Factors run highest first, every seed of one before the next; a factor whose point failed early
    runs no more seeds; the sweep ends `below` factors after the first that met the goal."""

    def __init__(self, factors: Sequence[float], seeds: Sequence[int], goal: float, below: int = 1) -> None:
        self.factors = sorted(set(factors), reverse=True)
        self.seeds = list(seeds)
        self.goal = goal
        self.below = below
        self.points: list[Point] = []

    def __iter__(self) -> Iterator[tuple[float, int]]:
        """The next (factor, seed); the caller `record`s its point before asking for the one after."""
        first = None
        for i, factor in enumerate(self.factors):
            for seed in self.seeds:
                yield factor, seed
                if self.points[-1].stopped:
                    break
            if first is None and passes(self.current(factor), self.goal, len(self.seeds)):
                first = i
            if first is not None and i - first >= self.below:
                return

    def current(self, factor: float) -> list[Point]:
        return [p for p in self.points if p.factor == factor]

    def record(self, point: Point) -> None:
        self.points.append(point)

    def miss_budget(self, factor: float, planned: int) -> int:
        """Misses the next seed of `factor` (`planned` requests) may have before the factor certainly
        fails, the seeds not yet run counted at `planned` requests each."""
        done = self.current(factor)
        total = sum(p.planned for p in done) + planned * (len(self.seeds) - len(done))
        allowed = math.floor((1 - self.goal) * total + 1e-9)
        return allowed - sum(p.planned - p.met for p in done)
