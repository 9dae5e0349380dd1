"""Grid-hash index: prefix hash at each grid point -> the node holding that point's last token.

Lets a lookup jump deep into the tree with O(log grid points) dict probes instead of walking every
node; the jump target is then verified token by token along its path.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.query import Query


class GridIndex:
    def __init__(self, step: int) -> None:
        self.step = step
        self._nodes: dict[int, Node] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def clear(self) -> None:
        self._nodes.clear()

    def register(self, node: Node, query: Query, seed: int) -> None:
        """Index the grid points of a new leaf, hashing only its own tokens (plus at most one block)."""
        first, stop = node.depth // self.step, node.end // self.step
        node.grid_hashes = query.grid_hashes_after(first, self._hash_at(node.parent, first, seed))[
            : stop - first
        ]
        node.grid_hashes = node.grid_hashes.copy()
        self._nodes.update(zip(node.grid_hashes.tolist(), repeat(node)))

    def _hash_at(self, node: Node, block: int, seed: int) -> int:
        """The stored prefix hash at grid point `block * step`, found on `node` or an ancestor."""
        position = block * self.step
        if position == 0:
            return seed
        while node.depth >= position:
            node = node.parent
        return int(node.grid_hashes[block - 1 - node.depth // self.step])

    def hand_over(self, prefix: Node, tail: Node) -> None:
        """After `tail` was split: its leading grid points now belong to `prefix`."""
        count = prefix.end // self.step - prefix.depth // self.step
        prefix.grid_hashes, tail.grid_hashes = tail.grid_hashes[:count], tail.grid_hashes[count:]
        nodes = self._nodes
        for grid_hash in prefix.grid_hashes.tolist():
            if nodes.get(grid_hash) is tail:
                nodes[grid_hash] = prefix

    def unregister(self, node: Node) -> None:
        nodes = self._nodes
        for grid_hash in node.grid_hashes.tolist():
            if nodes.get(grid_hash) is node:
                del nodes[grid_hash]

    def _probe(self, hashes: np.ndarray, points: int, query: Query) -> Node | None:
        node = self._nodes.get(int(hashes[points - 1]))
        position = points * self.step
        if node is None or node.namespace != query.namespace or not node.depth < position <= node.end:
            return None
        return node

    def deepest_hit(self, query: Query) -> tuple[Node, int] | None:
        """The deepest grid point whose prefix hash is indexed: (node, position). Unverified."""
        hashes = query.grid_hashes
        lo, hi, best = 0, len(hashes), None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            node = self._probe(hashes, mid, query)
            if node is None:
                hi = mid - 1
            else:
                lo, best = mid, node
        return None if best is None else (best, lo * self.step)
