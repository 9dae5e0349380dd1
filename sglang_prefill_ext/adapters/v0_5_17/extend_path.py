"""What the extension's dense-family extend paths (cascade, gathered dense) share inside SGLang 0.5.17's
FlashInfer backend: decide once per batch, plan at the first layer, run per layer.

A path's lifecycle per extend batch:

1. `wants(forward_batch)` — the decision (`_decide`), made once per batch and remembered. Deciding may
   read back to the host, so a batch a path takes must run without a prefill CUDA graph: the
   backend's `wants_eager_prefill` includes `wants`, which the graph runner asks before
   `init_forward_metadata`.
2. `begin(forward_batch)` in `init_forward_metadata` (never under graph capture): takes the batch.
3. `runs(q, k, layer, forward_batch)` / `forward(...)` in `forward_extend`: for the taken batch and
   plain causal self-attention layers, write K/V to the pool as stock does, plan FlashInfer at the
   first such layer (again only if a layer's scale or soft cap differs), run. Any other batch (e.g. a
   graph replay's static batch) or layer runs stock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import torch
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

from sglang_prefill_ext.config import PrefillExtConfig

if TYPE_CHECKING:
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention

EXTEND_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)
HALF_DTYPES = (torch.bfloat16, torch.float16)

Plan = TypeVar("Plan")


class PlannedAttention(Protocol):
    """An ops-level attention that was planned for one batch: run it on one layer's pool."""

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor: ...


def plain_causal_layer(layer: RadixAttention) -> bool:
    """Decoder self-attention without a sliding window: what the extension's prefill paths can take."""
    return (
        not layer.is_cross_attention
        and layer.attn_type != AttentionType.ENCODER_ONLY
        and layer.sliding_window_size in (None, -1)
    )


def write_kv(
    backend: FlashInferAttnBackend,
    layer: RadixAttention,
    forward_batch: ForwardBatch,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store this layer's new K/V in the pool exactly as stock's paged path does."""
    loc = KVWriteLoc(forward_batch.out_cache_loc, backend.forward_metadata.swa_out_cache_loc)
    backend.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, *backend._kv_write_scales(layer))


def batch_lens(forward_batch: ForwardBatch) -> tuple[list[int], list[int]] | None:
    """(prefix_lens, extend_lens) of a plain extend batch as host ints, else None."""
    prefix_lens, extend_lens = forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu
    if forward_batch.forward_mode not in EXTEND_MODES or prefix_lens is None or not extend_lens:
        return None
    return [int(x) for x in prefix_lens], [int(x) for x in extend_lens]


def backend_supported(backend: FlashInferAttnBackend) -> bool:
    """A configuration stock runs through plain FlashInfer prefill (no SWA / MIS / multimodal masks,
    no deterministic split, no dequantising workspace, half-precision KV of the query's dtype)."""
    updater = backend.indices_updater_prefill
    return (
        backend.dispatch_reason is None
        and not backend.enable_mis
        and not backend.is_multimodal
        and not backend.enable_deterministic
        and not backend.prefill_uses_dequant_workspace
        and backend.flashinfer_kv_cache_dtype in HALF_DTYPES
        and backend.flashinfer_kv_cache_dtype == updater.q_data_type
    )


class ExtendPath(Generic[Plan]):
    """Subclasses give `_decide` (the batch's plan inputs, or None for stock), `_num_tokens` and `_plan`
    (which plans `attention`)."""

    def __init__(
        self, backend: FlashInferAttnBackend, config: PrefillExtConfig, attention: PlannedAttention | None
    ) -> None:
        self._backend = backend
        self._config = config
        self._attention = attention
        self._decided: tuple[ForwardBatch, Plan | None] | None = None
        self._batch: ForwardBatch | None = None
        self._planned: tuple[float, float] | None = None

    def _decide(self, forward_batch: ForwardBatch) -> Plan | None:
        raise NotImplementedError

    def _num_tokens(self, plan: Plan) -> int:
        raise NotImplementedError

    def _plan(self, plan: Plan, layer: RadixAttention, dtype: torch.dtype) -> None:
        raise NotImplementedError

    def _decision(self, forward_batch: ForwardBatch) -> Plan | None:
        if self._decided is None or self._decided[0] is not forward_batch:
            self._decided = (forward_batch, self._decide(forward_batch))
        return self._decided[1]

    def wants(self, forward_batch: ForwardBatch) -> bool:
        """True for the extend batches this path takes (they must run without a prefill CUDA graph)."""
        return self._decision(forward_batch) is not None

    def begin(self, forward_batch: ForwardBatch | None) -> bool:
        """Take `forward_batch` if it qualifies (None: take nothing); call from `init_forward_metadata`.
        True if taken."""
        self._batch = forward_batch if forward_batch is not None and self.wants(forward_batch) else None
        self._planned = None
        return self._batch is not None

    def runs(
        self, q: torch.Tensor, k: torch.Tensor | None, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> bool:
        return (
            forward_batch is self._batch
            and k is not None
            and plain_causal_layer(layer)
            and q.shape[0] == self._num_tokens(self._decision(forward_batch))
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if save_kv_cache:
            write_kv(self._backend, layer, forward_batch, k, v)
        q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
        key = (layer.scaling, layer.logit_cap)
        if self._planned != key:
            self._plan(self._decision(forward_batch), layer, q.dtype)
            self._planned = key
        k_buffer, v_buffer = self._backend.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return self._attention.run(q, k_buffer, v_buffer).view(-1, layer.tp_q_head_num * layer.head_dim)
