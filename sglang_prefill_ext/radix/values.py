"""How the tree treats slot arrays: it only slices them, joins them, and copies what it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class ValueOps(Protocol):
    """Operations on the adapter's slot arrays (anything sliceable: numpy arrays, torch tensors)."""

    def empty(self) -> Any: ...

    def join(self, parts: Sequence[Any]) -> Any: ...

    def own(self, part: Any) -> Any:
        """A private copy of `part`, so the tree never aliases a caller's buffer."""
        ...


class NumpyValues:
    """Slot arrays as int64 numpy arrays: the core's default, used by its own tests."""

    def empty(self) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def join(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts)

    def own(self, part: np.ndarray) -> np.ndarray:
        return np.array(part, dtype=np.int64)
