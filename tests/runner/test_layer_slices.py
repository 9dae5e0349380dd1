"""The layer ranges of a sliced pass (--prefill-ext-yield-layers)."""

from __future__ import annotations

import pytest

from sglang_prefill_ext.runner.layer_slices import layer_slices


@pytest.mark.parametrize(
    ("layers", "per", "slices"),
    [
        (8, 3, [(0, 3), (3, 6), (6, 8)]),
        (8, 4, [(0, 4), (4, 8)]),
        (32, 32, [(0, 32)]),
        (4, 9, [(0, 4)]),
        (3, 1, [(0, 1), (1, 2), (2, 3)]),
    ],
)
def test_slices_cover_every_layer_once_in_order(layers: int, per: int, slices: list[tuple[int, int]]) -> None:
    assert layer_slices(layers, per) == slices


@pytest.mark.parametrize(("layers", "per"), [(0, 4), (8, 0)])
def test_empty_slicing_refused(layers: int, per: int) -> None:
    with pytest.raises(ValueError):
        layer_slices(layers, per)
