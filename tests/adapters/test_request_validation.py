"""Token ids outside the vocabulary: a 400-style ValueError under the flag, stock behaviour without.

Runs SGLang 0.5.17's own patched `TokenizerManager._validate_one_request` on the CPU (a manager with
only the fields that method reads; building a real one needs a model and a running scheduler)."""

from __future__ import annotations

import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_prefill_ext.patching import PatchSet

VOCAB = 1000


@pytest.fixture
def manager(patched_sglang: PatchSet):
    if patched_sglang.version != "0.5.17":
        pytest.skip("request validation is patched on SGLang 0.5.17 only")
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    def make(enabled: bool) -> TokenizerManager:
        m = TokenizerManager.__new__(TokenizerManager)
        m.server_args = types.SimpleNamespace(enable_prefill_ext=enabled, prefill_ext_options=None)
        m.model_config = types.SimpleNamespace(vocab_size=VOCAB)
        m.context_len = 4096
        m.num_reserved_tokens = 0
        m.allow_auto_truncate = False
        m.validate_total_tokens = True
        m.is_generation = True
        return m

    return make


def _request(ids: list[int]):
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 4})


@pytest.mark.parametrize(
    ("ids", "message"),
    [([1, 2, VOCAB, 3], "greater than the vocab size"), ([1, -5, 3], "negative token id")],
)
def test_out_of_vocab_ids_are_refused_under_the_flag(manager, ids: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        manager(True)._validate_one_request(_request(ids), ids)


def test_valid_ids_pass_and_flag_off_is_stock(manager) -> None:
    manager(True)._validate_one_request(_request([0, 5, VOCAB - 1]), [0, 5, VOCAB - 1])
    # stock 0.5.17 does not check the vocabulary here (the scheduler fails later): neither do we
    manager(False)._validate_one_request(_request([1, VOCAB + 7]), [1, VOCAB + 7])
    with pytest.raises(ValueError, match="longer than the model's context length"):
        manager(True)._validate_one_request(_request([1] * 5000), [1] * 5000)


def test_a_batch_gets_stock_s_message_for_its_offending_row(manager) -> None:
    from sglang_prefill_ext.adapters.common import validate_token_ids

    m = manager(True)
    batch = [[1, 2], [3, VOCAB, 4]]
    with pytest.raises(ValueError) as ours:
        validate_token_ids(batch, VOCAB, m._validate_input_ids_in_vocab)
    with pytest.raises(ValueError) as stock:
        m._validate_input_ids_in_vocab(batch, VOCAB)
    assert str(ours.value) == str(stock.value)
    validate_token_ids([[1, 2], [VOCAB - 1]], VOCAB, m._validate_input_ids_in_vocab)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.lists(
            st.one_of(
                st.integers(0, VOCAB - 1), st.integers(-(2**40), 2**40), st.sampled_from([-1, VOCAB, 2**32])
            ),
            max_size=12,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_the_fast_check_refuses_exactly_what_a_python_walk_refuses(manager, rows: list[list[int]]) -> None:
    from sglang_prefill_ext.adapters.common import validate_token_ids

    stock_check = manager(True)._validate_input_ids_in_vocab
    expected = None  # the message of the first bad row, checked the way stock would (vocab first)
    for row in rows:
        if row and max(row) >= VOCAB:
            with pytest.raises(ValueError) as stock:
                stock_check(row, VOCAB)
            expected = str(stock.value)
            break
        if row and min(row) < 0:
            expected = f"The input_ids contain a negative token id ({min(row)}); valid range is [0, {VOCAB})."
            break
    batch = rows if len(rows) > 1 else rows[0]
    if not batch:
        return
    if expected is None:
        validate_token_ids(batch, VOCAB, stock_check)
    else:
        with pytest.raises(ValueError) as ours:
            validate_token_ids(batch, VOCAB, stock_check)
        assert str(ours.value) == expected
