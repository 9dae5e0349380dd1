"""Shared-prefix cascade attention inside SGLang 0.5.17's FlashInfer backend (`--prefill-ext-cascade`).

`CascadeExtend` is what the extension's backend (attention.py) delegates to; it holds no SGLang
state of its own beyond the batch it planned. Per extend batch:

1. `wants(forward_batch)` — the decision, made once per batch and remembered: plain EXTEND/MIXED,
   a backend configuration stock would run through its ragged + paged split, >= 2 requests, the
   requests' common cached prefix (the longest run of identical leading KV slots in req_to_token:
   the prefix tree gives every request that matched a node that node's slots) of at least
   `cascade_min_shared` tokens, and the cost rule (`ops.cascade_rule`) predicting at least
   `cascade_min_speedup`. Finding the shared prefix reads back to the host, so a batch that takes
   cascade must run without a prefill CUDA graph: the backend's `wants_eager_prefill` must include
   `wants`, which the graph runner asks before `init_forward_metadata`.
2. `begin(forward_batch)` in `init_forward_metadata` (never under graph capture): takes the batch.
3. `runs(q, k, layer, forward_batch)` / `forward(...)` in `forward_extend`: for the planned batch and
   plain causal self-attention layers, write K/V to the pool as stock does, plan FlashInfer at the
   first such layer (again only if a layer's scale or soft cap differs), run cascade. Any other batch
   (e.g. a graph replay's static batch) or layer runs stock.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.ops.cascade import (
    CascadeIndices,
    CascadePrefill,
    build_cascade_indices,
    merge_supported,
    shared_prefix_len,
)
from sglang_prefill_ext.ops.cascade_rule import CascadeShape, choose_cascade

if TYPE_CHECKING:
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention

logger = logging.getLogger(__name__)

_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)
_DTYPES = (torch.bfloat16, torch.float16)


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


class CascadeExtend:
    def __init__(self, backend: FlashInferAttnBackend, config: PrefillExtConfig) -> None:
        self._backend = backend
        self._config = config
        self._attention = CascadePrefill(backend.workspace_buffer)
        self._decided: tuple[ForwardBatch, CascadeIndices | None] | None = None
        self._batch: ForwardBatch | None = None
        self._planned: tuple[float, float] | None = None

    def _backend_supported(self) -> bool:
        backend = self._backend
        updater = backend.indices_updater_prefill
        return (
            backend.dispatch_reason is None
            and not backend.enable_mis
            and not backend.is_multimodal
            and not backend.enable_deterministic
            and not backend.prefill_uses_dequant_workspace
            and backend.flashinfer_kv_cache_dtype in _DTYPES
            and backend.flashinfer_kv_cache_dtype == updater.q_data_type
            and merge_supported(updater.num_qo_heads, updater.head_dim, updater.q_data_type)
        )

    def _plan_indices(self, forward_batch: ForwardBatch) -> CascadeIndices | None:
        """The batch's cascade indices if it takes cascade, else None (one host read-back when eligible)."""
        prefix_lens, extend_lens = forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu
        if forward_batch.forward_mode not in _MODES or prefix_lens is None or extend_lens is None:
            return None
        prefix_lens, extend_lens = [int(x) for x in prefix_lens], [int(x) for x in extend_lens]
        min_shared = self._config.cascade_min_shared
        if len(prefix_lens) < 2 or min(prefix_lens) < min_shared or not self._backend_supported():
            return None
        req_to_token = self._backend.req_to_token_pool.req_to_token
        shared = shared_prefix_len(req_to_token, forward_batch.req_pool_indices, prefix_lens)
        if shared < min_shared:
            return None
        indices = build_cascade_indices(
            req_to_token, forward_batch.req_pool_indices, prefix_lens, extend_lens, shared
        )
        updater = self._backend.indices_updater_prefill
        shape = CascadeShape(
            shared,
            prefix_lens,
            extend_lens,
            indices.shared_start is not None,
            updater.num_qo_heads,
            updater.head_dim,
            self._backend.token_to_kv_pool.layer_num,
        )
        decision = choose_cascade(shape, min_shared, self._config.cascade_min_speedup)
        if not decision.use_cascade:
            return None
        logger.info(
            "prefill-ext cascade: %d requests, %d shared tokens (contiguous %s), %d new; model %.2fx",
            len(prefix_lens),
            shared,
            shape.shared_contiguous,
            indices.num_tokens,
            decision.speedup,
        )
        return indices

    def _indices_for(self, forward_batch: ForwardBatch) -> CascadeIndices | None:
        if self._decided is None or self._decided[0] is not forward_batch:
            self._decided = (forward_batch, self._plan_indices(forward_batch))
        return self._decided[1]

    def wants(self, forward_batch: ForwardBatch) -> bool:
        """True for the extend batches that take cascade (they must run without a prefill CUDA graph)."""
        return self._indices_for(forward_batch) is not None

    def begin(self, forward_batch: ForwardBatch) -> None:
        """Take `forward_batch` for cascade if it qualifies; call from `init_forward_metadata`."""
        self._batch = forward_batch if self.wants(forward_batch) else None
        self._planned = None

    def runs(
        self, q: torch.Tensor, k: torch.Tensor | None, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> bool:
        return (
            forward_batch is self._batch
            and k is not None
            and plain_causal_layer(layer)
            and q.shape[0] == self._indices_for(forward_batch).num_tokens
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
            indices = self._indices_for(forward_batch)
            self._attention.plan(
                indices, layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim, q.dtype, *key
            )
            self._planned = key
        k_buffer, v_buffer = self._backend.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return self._attention.run(q, k_buffer, v_buffer).view(-1, layer.tp_q_head_num * layer.head_dim)
