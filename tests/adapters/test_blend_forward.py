"""The one-pass blended forward's batch arithmetic (`adapters/v0_5_17/blend_forward.py`): the expanded
`ScheduleBatch` copy (one entry per computed run, over the request's row) and the backends it runs on.
End to end through SGLang's `Engine` (one pass against the plan's passes): tests/blend/test_blend_serving.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("sglang.srt.model_executor.forward_batch_info")

from sglang.srt.model_executor.forward_batch_info import compute_position_torch  # noqa: E402

from sglang_prefill_ext.adapters.v0_5_17 import blend_forward  # noqa: E402
from sglang_prefill_ext.config import PrefillExtConfig  # noqa: E402


@dataclasses.dataclass
class Batch:
    """What `_expand` reads of a `ScheduleBatch`, as `prepare_for_extend` leaves it."""

    reqs: list[str]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_logprob_start_lens: list[int]
    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    orig_seq_lens: torch.Tensor
    top_logprobs_nums: list[int]
    token_ids_logprobs: list[Any]
    multimodal_inputs: list[Any]
    sampling_info: Any = dataclasses.field(default_factory=dict)
    input_ids: torch.Tensor = dataclasses.field(init=False)
    out_cache_loc: torch.Tensor = dataclasses.field(init=False)
    seq_lens: torch.Tensor = dataclasses.field(init=False)
    seq_lens_cpu: torch.Tensor = dataclasses.field(init=False)
    seq_lens_sum: int = dataclasses.field(init=False)
    extend_num_tokens: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # each row's token id and slot: its position (+ 1000 x the request's index, + 100 for slots)
        rows = [
            1000 * i + p
            for i, (pre, n) in enumerate(zip(self.prefix_lens, self.extend_lens, strict=True))
            for p in range(pre, pre + n)
        ]
        self.input_ids = torch.tensor(rows)
        self.out_cache_loc = torch.tensor(rows) + 100
        seq = [pre + n for pre, n in zip(self.prefix_lens, self.extend_lens, strict=True)]
        self.seq_lens_cpu = torch.tensor(seq)
        self.seq_lens = self.seq_lens_cpu.clone()
        self.seq_lens_sum = sum(seq)
        self.extend_num_tokens = len(rows)


def batch() -> Batch:
    """A request beside a blended one: a 5-token extend after a prefix of 3; the blended request's
    extend [10, 40), its computed runs [10, 14), [20, 23), [37, 40)."""
    return Batch(
        reqs=["plain", "blended"],
        prefix_lens=[3, 10],
        extend_lens=[5, 30],
        extend_logprob_start_lens=[2, 30],
        req_pool_indices=torch.tensor([7, 4]),
        req_pool_indices_cpu=torch.tensor([7, 4]),
        orig_seq_lens=torch.tensor([8, 40], dtype=torch.int32),
        top_logprobs_nums=[1, 0],
        token_ids_logprobs=[None, [5]],
        multimodal_inputs=[None, None],
    )


ENTRIES = {1: [(10, 14), (20, 23), (37, 40)]}


def test_the_blended_request_becomes_one_entry_per_computed_run_over_its_row() -> None:
    original = batch()
    view, last = blend_forward._expand(original, ENTRIES)
    assert view.reqs == ["plain", "blended", "blended", "blended"]
    assert view.prefix_lens == [3, 10, 20, 37]
    assert view.extend_lens == [5, 4, 3, 3]
    assert view.seq_lens.tolist() == view.seq_lens_cpu.tolist() == [8, 14, 23, 40]
    assert view.seq_lens_sum == 8 + 14 + 23 + 40
    assert view.req_pool_indices.tolist() == view.req_pool_indices_cpu.tolist() == [7, 4, 4, 4]
    assert view.orig_seq_lens.tolist() == [8, 40, 40, 40]
    # the computed rows only, each with its own slot; SGLang's positions of the entries are theirs
    computed = [*range(10, 14), *range(20, 23), *range(37, 40)]
    assert view.input_ids.tolist() == [*range(3, 8), *(1000 + p for p in computed)]
    assert view.out_cache_loc.tolist() == [t + 100 for t in view.input_ids.tolist()]
    assert view.extend_num_tokens == len(view.input_ids) == sum(view.extend_lens)
    positions, starts = compute_position_torch(torch.tensor(view.prefix_lens), torch.tensor(view.extend_lens))
    assert positions.tolist() == [*range(3, 8), *computed]
    assert starts.tolist() == [0, 5, 9, 12]
    # no input logprobs across entries; the per-request lists follow the entries
    assert view.extend_logprob_start_lens == [2, 4, 3, 3]
    assert view.top_logprobs_nums == [1, 0, 0, 0]
    assert view.token_ids_logprobs == [None, [5], [5], [5]]
    # each request's last entry: the rows sampling keeps
    assert last == [0, 3]
    assert view.sampling_info is not original.sampling_info


def test_the_schedule_batch_is_left_as_it_was() -> None:
    original = batch()
    before = {f.name: getattr(original, f.name) for f in dataclasses.fields(original)}
    blend_forward._expand(original, ENTRIES)
    for name, value in before.items():
        assert getattr(original, name) is value, name
    assert original.prefix_lens == [3, 10] and original.extend_lens == [5, 30]


def test_a_batch_without_blended_entries_is_its_own_expansion() -> None:
    original = batch()
    view, last = blend_forward._expand(original, {})
    assert view.prefix_lens == original.prefix_lens and view.extend_lens == original.extend_lens
    assert torch.equal(view.input_ids, original.input_ids) and last == [0, 1]


def _backend(name: str, **fields: Any) -> Any:
    module, _, qualname = name.rpartition(".")
    return type(qualname, (), {"__module__": module, **fields})()


ATTENTION = "sglang.srt.layers.attention"


@pytest.mark.parametrize(
    ("backend", "why"),
    [
        (_backend(f"{ATTENTION}.torch_native_backend.TorchNativeAttnBackend"), None),
        (_backend(f"{ATTENTION}.flashattention_backend.FlashAttentionBackend"), None),
        (
            _backend(
                f"{ATTENTION}.flashinfer_backend.FlashInferAttnBackend", use_paged=True, prefill_backend="fa2"
            ),
            None,
        ),
        (
            _backend(
                f"{ATTENTION}.flashinfer_backend.FlashInferAttnBackend",
                use_paged=False,
                prefill_backend="fa2",
            ),
            "FlashInfer's ragged prefill",
        ),
        (_backend(f"{ATTENTION}.triton_backend.TritonAttnBackend"), "backend TritonAttnBackend"),
        (
            _backend(f"{ATTENTION}.flashattention_backend.FlashAttentionBackend", attention_chunk_size=8192),
            "chunked local attention",
        ),
        # the extension's block-sparse subclass (under --prefill-ext-sparse) is not SGLang's class
        (
            _backend("sglang_prefill_ext.adapters.v0_5_17.flashattention.PrefillExtFlashAttentionBackend"),
            "backend",
        ),
        # a hybrid backend: its prefill backend decides
        (
            _backend(
                f"{ATTENTION}.hybrid_attn_backend.HybridAttnBackend",
                prefill_backend=_backend(f"{ATTENTION}.torch_native_backend.TorchNativeAttnBackend"),
            ),
            None,
        ),
    ],
)
def test_the_backends_one_pass_runs_on(backend: Any, why: str | None) -> None:
    refusal = blend_forward.refusal(backend, PrefillExtConfig(blend=True))
    if why is None:
        assert refusal is None
    else:
        assert refusal is not None and why in refusal


def test_yield_layers_runs_the_passes() -> None:
    backend = _backend(f"{ATTENTION}.torch_native_backend.TorchNativeAttnBackend")
    refusal = blend_forward.refusal(backend, PrefillExtConfig(blend=True, yield_layers=4))
    assert refusal is not None and "--prefill-ext-yield-layers" in refusal
