"""A request's `chunk_spans` through SGLang 0.5.17's patched tokenizer manager (docs/BLEND.md).

Runs the real `GenerateReqInput` / `TokenizedGenerateReqInput` and `TokenizerManager`'s own
`_validate_one_request` and `_create_tokenized_object` on the CPU (a manager with only the fields
those read: a real one needs a model and a running scheduler; "under the flag" is a config with
`blend` set), and the `/v1/completions` handler (`OpenAIServingCompletion`) over it. Through a real
engine: tests/blend/test_blend_serving.py."""

from __future__ import annotations

import collections
import re
import types

import pytest

from sglang_prefill_ext.adapters import common
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.patching import PatchSet

PROMPT = list(range(10))


@pytest.fixture
def manager(patched_sglang: PatchSet, monkeypatch: pytest.MonkeyPatch):
    if patched_sglang.version != "0.5.17":
        pytest.skip("the chunk_spans field is patched on SGLang 0.5.17 only")
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.sampling.sampling_params import SamplingParams

    def make(extension: bool, blend: bool = False) -> TokenizerManager:
        m = TokenizerManager.__new__(TokenizerManager)
        m.server_args = types.SimpleNamespace(
            enable_prefill_ext=extension, prefill_ext_options=None, disaggregation_transfer_backend="mooncake"
        )
        if blend:
            real = common.prefill_ext_config
            monkeypatch.setattr(
                common,
                "prefill_ext_config",
                lambda args: PrefillExtConfig(blend=True) if args is m.server_args else real(args),
            )
        m.model_config = types.SimpleNamespace(vocab_size=1000)
        m.context_len = 4096
        m.num_reserved_tokens = 0
        m.allow_auto_truncate = False
        m.validate_total_tokens = True
        m.is_generation = True
        m.preferred_sampling_params = None
        m.sampling_params_class = SamplingParams
        m.tokenizer = None
        stats = types.SimpleNamespace(set_tokenize_finish_time=lambda: None)
        m.rid_to_state = collections.defaultdict(lambda: types.SimpleNamespace(time_stats=stats))
        return m

    return make


def _tokenized(m, spans, ids: list[int] = PROMPT):
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 4}, chunk_spans=spans)
    obj.normalize_batch_and_arguments()
    m._validate_one_request(obj, ids)
    return m._create_tokenized_object(obj, None, ids)


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ("0-4", re.escape("chunk_spans must be a list of [start, end] pairs of integer token offsets.")),
        ([[0, 4], [4, 4]], r"chunk_spans\[1\] = \[4, 4\] is not a non-empty span of the prompt's 10 tokens"),
        ([[0, 5], [4, 8]], r"chunk_spans\[1\] = \[4, 8\] starts before chunk_spans\[0\] ends \(5\)"),
        ([[0, 11]], r"chunk_spans\[0\] = \[0, 11\] is not a non-empty span"),
    ],
)
def test_malformed_spans_are_refused_under_the_flag(manager, spans, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _tokenized(manager(True, blend=True), spans)


def test_spans_are_carried_to_the_scheduler_s_request_under_the_flag(manager) -> None:
    from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode

    tokenized = _tokenized(manager(True, blend=True), [[2, 5], [5, 9]])
    assert tokenized.chunk_spans == ((2, 5), (5, 9))
    # the field survives the scheduler's IPC (`_send_one_request`)
    tokenized.time_stats = None
    tokenized.wrap_pickle_fields()
    assert msgpack_decode(msgpack_encode(tokenized)).chunk_spans == ((2, 5), (5, 9))
    assert _tokenized(manager(True, blend=True), None).chunk_spans is None
    assert _tokenized(manager(True, blend=True), []).chunk_spans is None


@pytest.mark.parametrize("extension", [False, True])
@pytest.mark.parametrize("spans", [[[2, 5]], "0-4", [[4, 4]], {"a": 1}])
def test_flag_off_the_field_is_dropped_as_stock_drops_it(manager, extension: bool, spans) -> None:
    assert _tokenized(manager(extension), spans).chunk_spans is None


def test_a_batch_gives_one_entry_per_prompt(manager) -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    m = manager(True, blend=True)
    batch = GenerateReqInput(
        input_ids=[PROMPT, PROMPT[:4]],
        sampling_params={"max_new_tokens": 4},
        chunk_spans=[[[0, 3], [3, 7]], None],
    )
    batch.normalize_batch_and_arguments()
    spans = [m._create_tokenized_object(batch[i], None, batch[i].input_ids).chunk_spans for i in range(2)]
    assert spans == [((0, 3), (3, 7)), None]
    # not one entry per prompt: the prompt without one is refused under the flag, dropped flag off
    short = GenerateReqInput(
        input_ids=[PROMPT, PROMPT], sampling_params={"max_new_tokens": 4}, chunk_spans=[[[0, 3]]]
    )
    short.normalize_batch_and_arguments()
    with pytest.raises(ValueError, match="must be a list of"):
        m._create_tokenized_object(short[1], None, PROMPT)
    assert manager(False)._create_tokenized_object(short[1], None, PROMPT).chunk_spans is None


@pytest.mark.parametrize("spans", [[[2, 5]], "0-4", {"a": 1}, 7])
def test_the_http_server_s_parse_takes_any_value(patched_sglang: PatchSet, spans) -> None:
    """`/generate`'s body is parsed by pydantic (FastAPI): no value of the field is a 422 there, so with
    the flag off a request carrying it is served as stock serves it (which drops the unknown key)."""
    if patched_sglang.version != "0.5.17":
        pytest.skip("the chunk_spans field is patched on SGLang 0.5.17 only")
    import pydantic
    from sglang.srt.managers.io_struct import GenerateReqInput

    parsed = pydantic.TypeAdapter(GenerateReqInput).validate_python(
        {"input_ids": PROMPT, "chunk_spans": spans}
    )
    assert parsed.chunk_spans == spans


def _completions(m):
    """SGLang's own `/v1/completions` handler over manager `m`, whose `generate_request` makes the
    tokenized request as the real one does (`_validate_one_request`, `_create_tokenized_object`)."""
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

    async def generate_request(obj, raw_request):
        obj.normalize_batch_and_arguments()
        m._validate_one_request(obj, obj.input_ids)
        yield m._create_tokenized_object(obj, None, obj.input_ids)

    m.generate_request = generate_request
    m.request_logger = types.SimpleNamespace(log_requests=False)
    return OpenAIServingCompletion(m, types.SimpleNamespace(completion_template_name=None))


def _body(spans) -> dict:
    """What the OpenAI client sends for `completions.create(prompt=PROMPT, extra_body={"chunk_spans":
    spans})`: the extra body's keys beside the others."""
    return {"model": "default", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "chunk_spans": spans}


@pytest.mark.parametrize("blend", [False, True])
def test_v1_completions_takes_chunk_spans_in_extra_body(manager, blend: bool) -> None:
    """A token-id prompt's spans reach the scheduler's request under the flag; flag off they are
    dropped, as for `/generate`."""
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

    m = manager(True, blend=blend)
    request = CompletionRequest.model_validate(_body([[2, 5], [5, 9]]))
    adapted, _ = _completions(m)._convert_to_internal_request(request, None)
    assert adapted.chunk_spans == [[2, 5], [5, 9]]
    adapted.normalize_batch_and_arguments()
    tokenized = m._create_tokenized_object(adapted, None, PROMPT)
    assert tokenized.chunk_spans == (((2, 5), (5, 9)) if blend else None)


def test_v1_completions_answers_malformed_spans_with_a_400(manager) -> None:
    """The handler's answer is stock's 400 kind of error (`BadRequestError`), `parse_chunk_spans`'s message."""
    import asyncio
    import json

    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

    request = CompletionRequest.model_validate(_body([[0, 5], [4, 8]]))
    response = asyncio.run(_completions(manager(True, blend=True)).handle_request(request, None))
    assert response.status_code == 400
    error = json.loads(response.body)
    assert error["type"] == "BadRequestError"
    assert error["message"].startswith("chunk_spans[1] = [4, 8] starts before chunk_spans[0] ends (5)")
