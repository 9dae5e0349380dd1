"""One lookup key: page-aligned int64 tokens in a namespace, with its grid hashes computed once."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from sglang_prefill_ext.radix.page_hash import GridHasher


class Query:
    __slots__ = ("tokens", "namespace", "length", "_hasher", "_grid_hashes")

    def __init__(self, tokens: np.ndarray, namespace: Hashable, page_size: int, hasher: GridHasher) -> None:
        self.length = len(tokens) // page_size * page_size
        self.tokens = tokens[: self.length]
        self.namespace = namespace
        self._hasher = hasher
        self._grid_hashes: np.ndarray | None = None

    @property
    def grid_hashes(self) -> np.ndarray:
        if self._grid_hashes is None:
            self._grid_hashes = self._hasher.prefix_hashes(self.tokens, self.namespace)
        return self._grid_hashes

    def has_grid_hashes(self) -> bool:
        return self._grid_hashes is not None

    def grid_hashes_after(self, first_block: int, base: int) -> np.ndarray:
        """Grid hashes from block `first_block` on; slices the full array when it was computed anyway."""
        if self._grid_hashes is not None:
            return self._grid_hashes[first_block:]
        return self._hasher.hashes_after(self.tokens, first_block, base)

    def page_key(self, pos: int, page_size: int) -> bytes:
        return self.tokens[pos : pos + page_size].tobytes()
