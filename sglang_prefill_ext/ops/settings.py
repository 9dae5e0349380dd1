"""What the block selection keeps: the knobs of the sparse layout, free of any serving framework."""

from __future__ import annotations

import dataclasses
import math

SCORERS = ("hybrid", "sampled", "pooled")


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    """Block-selection rule.

    A query block keeps a key block when it is causal (not after the diagonal) and any of:
    a sink (one of the first `sink_blocks`), inside the local window (`local_blocks` ending at the
    diagonal), the diagonal itself, the query block is one of the request's last `last_blocks`, or the
    scorer picks it. Scorer "sampled": the block is among the fewest, largest blocks holding `mass` of
    the row's attention as estimated from `samples` exact query rows per block and head (sampled.py).
    Scorer "pooled": its pooled score reaches `threshold` x the row's best for some query head of the
    KV head's group. Scorer "hybrid": either rule keeps it. With `per_query_head` every query head
    gets its own blocks (its own sampled mass, its own pooled score) instead of one set per KV head.
    """

    block_size: int = 128
    scorer: str = "hybrid"
    mass: float = 0.95
    samples: int = 2
    threshold: float = 0.003
    sink_blocks: int = 1
    local_blocks: int = 4
    last_blocks: int = 1
    per_query_head: bool = False

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {self.scorer!r}")
        if not 0.0 <= self.mass <= 1.0:
            raise ValueError(f"mass must lie in [0, 1], got {self.mass}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold}")
        if min(self.sink_blocks, self.local_blocks, self.last_blocks) < 0:
            raise ValueError("sink_blocks, local_blocks and last_blocks must be >= 0")

    @property
    def log_threshold(self) -> float:
        """The threshold as a logit margin below the row's best (-inf keeps every block)."""
        return math.log(self.threshold) if self.threshold > 0 else -math.inf
