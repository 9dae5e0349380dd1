"""Where a sliced prefill pass yields (--prefill-ext-yield-layers): its layer ranges."""

from __future__ import annotations


def layer_slices(num_layers: int, per_slice: int) -> list[tuple[int, int]]:
    """The `[start, end)` layer ranges of a pass run `per_slice` layers at a time, in order; the last
    one may be shorter."""
    if num_layers < 1 or per_slice < 1:
        raise ValueError(f"{num_layers} layers in slices of {per_slice}: both must be >= 1")
    return [(start, min(start + per_slice, num_layers)) for start in range(0, num_layers, per_slice)]
