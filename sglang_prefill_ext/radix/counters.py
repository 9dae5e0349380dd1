"""Cumulative prefix-tree counters, exposed for metrics."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class TreeCounters:
    hit_tokens: int = 0
    missed_tokens: int = 0
    evicted_tokens: int = 0
    inserted_tokens: int = 0
    nodes: int = 0
    splits: int = 0
    rematches: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
