"""One lookup key: page-aligned int64 tokens in a namespace."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np


class Query:
    __slots__ = ("tokens", "namespace", "length")

    def __init__(self, tokens: np.ndarray, namespace: Hashable, page_size: int) -> None:
        self.length = len(tokens) // page_size * page_size
        self.tokens = tokens[: self.length]
        self.namespace = namespace

    def page_key(self, pos: int, page_size: int) -> bytes:
        return self.tokens[pos : pos + page_size].tobytes()
