"""The benchmarks' one percentile, and paired right/wrong answers of two runs on the same items."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mcnemar_exact(lost: int, gained: int) -> float:
    """McNemar's exact two-sided p for paired right/wrong answers: the binomial test of the discordant pairs
    (`lost`: right only in the first run, `gained`: only in the second) against an even split."""
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(lost, gained) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclasses.dataclass(frozen=True)
class Paired:
    """Two runs' answers to the same items: how many, each run's right ones, the items right only in the
    reference (`lost`) and only in the other (`gained`), McNemar's exact p, and the share of the reference's
    right answers the other keeps net of gained (None where the reference has none)."""

    n: int
    ref: int
    other: int
    lost: int
    gained: int
    p: float
    keep: float | None

    @classmethod
    def of(cls, pairs: Iterable[tuple[bool, bool]]) -> Paired:
        """From (reference right, other right) per item."""
        pairs = list(pairs)
        ref = sum(r for r, _ in pairs)
        lost = sum(r and not o for r, o in pairs)
        gained = sum(o and not r for r, o in pairs)
        other = ref - lost + gained
        return cls(
            len(pairs), ref, other, lost, gained, mcnemar_exact(lost, gained), other / ref if ref else None
        )
