"""What the runner remembers about a waiting request between passes, and the lpm-aging order.

LPM with aging: requests that have waited `max_wait_passes` passes or more come first, oldest
first; the rest by longest cached prefix, ties by arrival. A request's match is refreshed only when
its stamp (what could change it, e.g. the children of the node its match ends at) changed, so a
pass costs O(1) per request whose match cannot have grown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable


@dataclasses.dataclass
class WaitState:
    arrival: int
    passes: int = 0
    dedup_passes: int = 0
    deduped_tokens: int = 0
    matched: int = 0
    stamp: Hashable = None  # the stamp its `matched` was taken at

    def aged(self, max_wait_passes: int) -> bool:
        return self.passes >= max_wait_passes


def lpm_aging_key(state: WaitState, max_wait_passes: int) -> tuple[int, int, int]:
    """Sort key: aged requests first by arrival, then the longest match, then arrival."""
    if state.aged(max_wait_passes):
        return (0, 0, state.arrival)
    return (1, -state.matched, state.arrival)
