"""Token keys as compact int64 arrays, compared with memcmp instead of per-token Python work.

Stored keys are `bytes` (little-endian int64, immutable, hashable); queries are int64 numpy views.
`bytes.startswith(buffer, offset)` compares a numpy slice against stored bytes with one memcmp,
without copying either side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOKEN_DTYPE = np.dtype("<i8")
TOKEN_BYTES = TOKEN_DTYPE.itemsize


def as_token_array(token_ids: Any, length: int) -> np.ndarray:
    """The first `length` tokens as an int64 array; a view (no copy) for int64 buffers like array('q').

    The view pins the caller's buffer (an `array` cannot resize while it is exported), so callers
    must not keep it beyond the operation.
    """
    try:
        tokens = np.frombuffer(token_ids, dtype=TOKEN_DTYPE)
    except (TypeError, ValueError):
        tokens = np.asarray(token_ids, dtype=TOKEN_DTYPE)
    return tokens[:length]


def common_prefix_len(stored: bytes, start: int, query: np.ndarray, limit: int) -> int:
    """How many leading tokens of `query[:limit]` equal the stored tokens from token `start` on.

    Gallops in doubling windows, then bisects the window that differs: O(prefix) bytes compared in
    O(log prefix) memcmp calls.
    """
    if stored.startswith(query[:limit], start * TOKEN_BYTES):
        return limit
    lo, step = 0, 1
    while True:
        hi = min(lo + step, limit)
        if not stored.startswith(query[lo:hi], (start + lo) * TOKEN_BYTES):
            break
        lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stored.startswith(query[lo:mid], (start + lo) * TOKEN_BYTES):
            lo = mid
        else:
            hi = mid
    return lo
