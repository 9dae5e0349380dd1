"""Prefix hashes on a page-aligned grid, computed in one vectorised pass over a prompt.

The grid step is a multiple of the page size (at least `MIN_GRID_TOKENS`), so a 128K-token prompt
has about 2K grid points instead of 128K: cheap to compute and to register, and still locating a
match to within one grid step with O(log grid points) dict probes. Hashes only route the search;
every hit is verified against stored tokens, so a collision costs time, never correctness.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

MIN_GRID_TOKENS = 64
_MASK64 = (1 << 64) - 1


def grid_step(page_size: int) -> int:
    """Smallest multiple of `page_size` that is at least MIN_GRID_TOKENS."""
    return page_size * -(-MIN_GRID_TOKENS // page_size)


def _splitmix64(counter: np.ndarray) -> np.ndarray:
    """Odd pseudo-random 64-bit weights, a pure function of the position (so they can grow lazily)."""
    with np.errstate(over="ignore"):
        x = counter.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x | np.uint64(1)


class GridHasher:
    """hash(tokens[:p]) for every grid point p: random-weight linear hashes mod 2**64.

    A block's hash is `block @ W` (weights per offset in the block); prefix hashes are the running
    sum of block hashes times per-block weights, seeded by the namespace.
    """

    def __init__(self, step: int) -> None:
        self.step = step
        self._in_block = _splitmix64(np.arange(step))
        self._per_block = _splitmix64(np.arange(1 << 20, (1 << 20) + 1024))

    def _block_weights(self, blocks: int) -> np.ndarray:
        if blocks > len(self._per_block):
            size = max(blocks, 2 * len(self._per_block))
            self._per_block = _splitmix64(np.arange(1 << 20, (1 << 20) + size))
        return self._per_block[:blocks]

    def seed(self, namespace: Hashable) -> int:
        """The hash of the empty prefix in `namespace`."""
        return hash(namespace) & _MASK64

    def prefix_hashes(self, tokens: np.ndarray, namespace: Hashable) -> np.ndarray:
        """uint64 array; entry b is the hash of tokens[: (b + 1) * step] in `namespace`."""
        return self.hashes_after(tokens, 0, self.seed(namespace))

    def hashes_after(self, tokens: np.ndarray, first_block: int, base: int) -> np.ndarray:
        """Prefix hashes from block `first_block` on, given `base`, the hash of the blocks before it.

        Only tokens[first_block * step:] are read: an insert hashes just what it adds.
        """
        blocks = len(tokens) // self.step
        if blocks <= first_block:
            return np.empty(0, dtype=np.uint64)
        grid = tokens[first_block * self.step : blocks * self.step].view(np.uint64).reshape(-1, self.step)
        with np.errstate(over="ignore"):
            block_hashes = grid @ self._in_block
            hashes = np.cumsum(block_hashes * self._block_weights(blocks)[first_block:], dtype=np.uint64)
            hashes += np.uint64(base)
        return hashes
