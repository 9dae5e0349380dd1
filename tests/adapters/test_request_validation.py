"""Token ids outside the vocabulary: a 400-style ValueError under the flag, stock behaviour without.

Runs SGLang 0.5.17's own patched `TokenizerManager._validate_one_request` on the CPU (a manager with
only the fields that method reads; building a real one needs a model and a running scheduler)."""

from __future__ import annotations

import types

import pytest

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
