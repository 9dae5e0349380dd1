"""The pass cost model: its inverse and its text form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_prefill_ext.runner.pass_cost import PassCost

COST = PassCost()


@given(st.floats(0.0, 2000.0), st.integers(0, 200_000))
def test_tokens_within_is_the_inverse_of_the_cost(ms: float, context: int) -> None:
    n = COST.tokens_within(ms, context)
    assert COST.variable_ms(n, context) <= ms + 1e-9
    assert COST.variable_ms(n + 1, context) > ms


def test_pass_cost_parses_and_refuses() -> None:
    assert PassCost.parse("5,22,890") == PassCost(5.0, 22.0, 890.0)
    for bad in ("5,22", "a,b,c", "1,-2,3"):
        with pytest.raises(ValueError, match="FIXED_MS,TOKEN_US,PAIR_PS"):
            PassCost.parse(bad)
