"""Shared-prefix cascade attention inside SGLang 0.5.17's FlashInfer backend (`--prefill-ext-cascade`).

`CascadeExtend` is one of the extension backend's extend paths (lifecycle in `extend_path`). It takes
a plain extend batch of >= 2 requests whose common cached prefix (the longest run of identical
leading KV slots in req_to_token: the prefix tree gives every request that matched a node that
node's slots) has at least `cascade_min_shared` tokens, when the cost rule (`ops.cascade_rule`)
predicts at least `cascade_min_speedup` over stock.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

from sglang_prefill_ext.adapters.v0_5_17.extend_path import ExtendPath, backend_supported, batch_lens
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


class CascadeExtend(ExtendPath[CascadeIndices]):
    def __init__(self, backend: FlashInferAttnBackend, config: PrefillExtConfig) -> None:
        super().__init__(backend, config, CascadePrefill(backend.workspace_buffer))

    def _decide(self, forward_batch: ForwardBatch) -> CascadeIndices | None:
        """The batch's cascade indices if it takes cascade, else None (one host read-back when eligible)."""
        lens = batch_lens(forward_batch)
        if lens is None:
            return None
        prefix_lens, extend_lens = lens
        min_shared = self._config.cascade_min_shared
        updater = self._backend.indices_updater_prefill
        if (
            len(prefix_lens) < 2
            or min(prefix_lens) < min_shared
            or not backend_supported(self._backend)
            or not merge_supported(updater.num_qo_heads, updater.head_dim, updater.q_data_type)
        ):
            return None
        req_to_token = self._backend.req_to_token_pool.req_to_token
        shared = shared_prefix_len(req_to_token, forward_batch.req_pool_indices, prefix_lens)
        if shared < min_shared:
            return None
        indices = build_cascade_indices(
            req_to_token, forward_batch.req_pool_indices, prefix_lens, extend_lens, shared
        )
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

    def _num_tokens(self, plan: CascadeIndices) -> int:
        return plan.num_tokens

    def _plan(self, plan: CascadeIndices, layer: RadixAttention, dtype: torch.dtype) -> None:
        self._attention.plan(
            plan,
            layer.tp_q_head_num,
            layer.tp_k_head_num,
            layer.head_dim,
            dtype,
            layer.scaling,
            layer.logit_cap,
        )
