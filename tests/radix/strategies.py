"""Keys for the radix machines: a tiny alphabet and extensions of earlier keys give deep shared prefixes."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from hypothesis import strategies as st

TOKENS = st.lists(st.integers(0, 3), max_size=40)
NAMESPACES = st.sampled_from([None, "lora-a"])
PICKS = st.integers(0, 10**6)


def grow_key(
    earlier: Sequence[tuple[Hashable, list[int]]],
    pick: int,
    extend: bool,
    namespace: Hashable,
    tail: list[int],
) -> tuple[Hashable, list[int]]:
    """A fresh key, or an earlier key cut at a pick-chosen point and continued with `tail`."""
    if not (extend and earlier):
        return namespace, tail
    namespace, base = earlier[pick % len(earlier)]
    return namespace, base[: (pick // 7) % (len(base) + 1)] + tail
