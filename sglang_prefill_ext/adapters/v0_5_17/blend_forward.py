"""A blended request's prefill in one forward pass on SGLang 0.5.17 (docs/BLEND.md, "Serving").

The scheduler admits a blended request whose whole prompt past its match fits the pass as one
ordinary extend of SGLang's `ScheduleBatch`: slots for every position, reused ones included
(`Blending.pend`). Just before the model forward (`tp_worker.forward_batch_generation`, through
`hooks.forward`), `forward`:

- places each reused run into the request's slots (K re-rotated, V copied);
- runs the model on an expanded batch: the request's one entry becomes one entry per computed run
  j, every entry over the request's `req_to_token` row, with prefix length start_j and sequence
  length end_j; input ids and `out_cache_loc` keep the computed rows only. That `ForwardBatch` is
  SGLang's own `ForwardBatch.init_new` over a shallow copy of the `ScheduleBatch` with its
  per-entry fields replaced, so positions, `extend_start_loc` and the device tensors are SGLang's;
- keeps, of the logits processor's rows (each entry's last), each request's last entry's: sampling
  then runs on the stock `ForwardBatch`, one row per request.

The backends `refusal` accepts write every entry's new KV into the pool before a layer's attention
reads the page table, and align the causal mask at each entry's end, so entry j's rows see every
slot before them, reused or computed by an earlier entry in the same layer: the plan's extends'
KV and logits in one pass, on stock kernels. A pending request this pass cannot expand (input
logprobs or full hidden states asked in its batch, input or replaced embeddings, multimodal inputs,
its extend not its whole plan) is computed whole.
"""

from __future__ import annotations

import copy
import weakref
from typing import TYPE_CHECKING, Any

import torch

from sglang_prefill_ext.config import PrefillExtConfig, option_name

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_prefill_ext.adapters.v0_5_17.blending import Blending

# SGLang's backends that write a layer's new KV before reading the page table, causal at each entry's end
_SHARED_ROW_BACKENDS = {
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend",
    "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend",
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend",
}
# by id: a ForwardBatch (a dataclass with fields compared) is not hashable
_expanded: weakref.WeakValueDictionary[int, ForwardBatch] = weakref.WeakValueDictionary()


def refusal(attn_backend: Any, config: PrefillExtConfig) -> str | None:
    """Why blended requests cannot run in one pass here (then: one extend per computed run); None if
    they can."""
    if config.yield_layers:
        return f"{option_name('yield_layers')} (a sliced pass runs its own forward)"
    backend = attn_backend
    if type(backend).__name__ == "HybridAttnBackend":  # its prefill backend runs the extend
        backend = backend.prefill_backend
    kind = type(backend)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name not in _SHARED_ROW_BACKENDS:
        return f"the prefill attention backend {kind.__name__}"
    if kind.__name__ == "FlashInferAttnBackend" and not backend.use_paged:
        # its ragged path attends over the prefix before the layer writes the batch's new KV
        return "FlashInfer's ragged prefill (SGLANG_FLASHINFER_USE_PAGED=1 takes its paged path)"
    if getattr(backend, "attention_chunk_size", None) is not None:
        return "chunked local attention"
    return None


def expanded(forward_batch: ForwardBatch) -> bool:
    """`forward_batch` is a blended one-pass batch (run without a captured prefill graph)."""
    return _expanded.get(id(forward_batch)) is forward_batch


def forward(
    blending: Blending,
    model_runner: ModelRunner,
    batch: ScheduleBatch,
    forward_batch: ForwardBatch,
    **kwargs: Any,
) -> Any:
    """`model_runner.forward(forward_batch, **kwargs)`, the requests of `batch` that `blending`
    admitted for one pass run as one entry per computed run."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    entries = _entries(blending, batch, forward_batch)
    if not entries:
        return model_runner.forward(forward_batch, **kwargs)
    view, last = _expand(batch, entries)
    wide = ForwardBatch.init_new(
        view,
        model_runner,
        capture_hidden_mode=forward_batch.capture_hidden_mode,
        return_hidden_states_before_norm=forward_batch.return_hidden_states_before_norm,
    )
    _expanded[id(wide)] = wide
    out = model_runner.forward(wide, **kwargs)
    logits = out.logits_output
    rows = torch.tensor(last, device=logits.next_token_logits.device)
    logits.next_token_logits = logits.next_token_logits[rows]
    if logits.hidden_states is not None:  # the last row's only (full capture is never expanded)
        logits.hidden_states = logits.hidden_states[rows]
    return out


def _entries(
    blending: Blending, batch: ScheduleBatch, forward_batch: ForwardBatch
) -> dict[int, list[tuple[int, int]]]:
    """Batch index -> the [start, end) entries of each request pending one pass, its reused runs
    placed; a pending request this batch cannot expand is computed whole instead."""
    pending = {i: a for i, req in enumerate(batch.reqs) if (a := blending.take(req)) is not None}
    if not pending:
        return {}
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    expandable = (
        forward_batch.forward_mode in (ForwardMode.EXTEND, ForwardMode.MIXED)
        and not forward_batch.capture_hidden_mode.is_full()
        and batch.input_embeds is None
        and batch.replace_embeds is None  # its positions index the batch's rows
        and not _input_logprobs(batch)
    )
    entries = {}
    for i, admission in pending.items():
        req, plan = batch.reqs[i], admission.plan
        start, length = batch.prefix_lens[i], batch.extend_lens[i]
        whole = start == plan.prefix_len and start + length == plan.runs[-1].end
        if expandable and whole and req.multimodal_inputs is None:
            blending.place_all(req)
            entries[i] = [(run.start, run.end) for run in plan.extends]
        else:
            blending.compute_from(req, plan.prefix_len)
    return entries


def _input_logprobs(batch: ScheduleBatch) -> bool:
    """A request of `batch` asks for input logprobs (its logprob rows would span entries)."""
    starts = batch.extend_logprob_start_lens or ()
    return batch.return_logprob and any(s < n for s, n in zip(starts, batch.extend_lens, strict=True))


def _expand(
    batch: ScheduleBatch, entries: dict[int, list[tuple[int, int]]]
) -> tuple[ScheduleBatch, list[int]]:
    """A shallow copy of `batch` with one entry per computed run of the requests in `entries` (the
    others' entries as they are), and the index of each request's last entry."""
    owner, prefix, extend, keep, last = [], [], [], [], []
    starts = batch.extend_logprob_start_lens
    logprob_starts = None if starts is None else []
    offset = 0
    for i in range(len(batch.reqs)):
        start, length = batch.prefix_lens[i], batch.extend_lens[i]
        for lo, hi in entries.get(i, [(start, start + length)]):
            owner.append(i)
            prefix.append(lo)
            extend.append(hi - lo)
            if logprob_starts is not None:
                # a blended request asks no input logprobs (`_input_logprobs`): none per entry either
                logprob_starts.append(hi - lo if i in entries else starts[i])
            keep.extend(range(offset + lo - start, offset + hi - start))
        offset += length
        last.append(len(owner) - 1)
    device = batch.seq_lens.device
    where = torch.tensor(owner, dtype=torch.int64)
    where_on_device = where.to(device)
    rows = torch.tensor(keep, dtype=torch.int64, device=device)
    seq_lens = [lo + n for lo, n in zip(prefix, extend, strict=True)]
    view = copy.copy(batch)
    view.reqs = [batch.reqs[i] for i in owner]
    view.sampling_info = copy.copy(batch.sampling_info)  # init_new sets its grammars per request
    view.input_ids = batch.input_ids[rows]
    view.out_cache_loc = batch.out_cache_loc[rows]
    view.extend_num_tokens = len(keep)
    view.req_pool_indices = batch.req_pool_indices[where_on_device]
    if batch.req_pool_indices_cpu is not None:
        view.req_pool_indices_cpu = batch.req_pool_indices_cpu[where]
    view.seq_lens_cpu = torch.tensor(seq_lens, dtype=batch.seq_lens_cpu.dtype)
    view.seq_lens = view.seq_lens_cpu.to(device=device, dtype=batch.seq_lens.dtype)
    view.seq_lens_sum = sum(seq_lens)
    view.orig_seq_lens = batch.orig_seq_lens[where_on_device]
    view.prefix_lens, view.extend_lens, view.extend_logprob_start_lens = prefix, extend, logprob_starts
    for name in ("top_logprobs_nums", "token_ids_logprobs", "multimodal_inputs"):
        per_request = getattr(batch, name)
        if per_request is not None:
            setattr(view, name, [per_request[i] for i in owner])
    return view, last
