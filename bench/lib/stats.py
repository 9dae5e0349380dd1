"""The benchmarks' one percentile."""

from __future__ import annotations

import math
from collections.abc import Sequence


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
