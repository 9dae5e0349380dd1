"""Gathered dense prefill inside SGLang 0.5.17's FlashInfer backend (`--prefill-ext-dense`).

`DenseExtend` is one of the extension backend's extend paths (lifecycle in `extend_path`): a plain
extend batch with a request bringing at least `dense_min_extend` new tokens attends each request's
new tokens to its whole context in one causal FlashInfer ragged pass over K/V gathered from the pool
(`ops.dense`), instead of stock's paged (FA2) pass over the cached prefix, or paged-only under a
prefill CUDA graph. The batch runs eagerly (no prefill CUDA graph): at that many new tokens per
request the graph saves little launch time.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

from sglang_prefill_ext.adapters.v0_5_17.extend_path import ExtendPath, backend_supported, batch_lens
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.ops.dense import GatheredPrefill

if TYPE_CHECKING:
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention


@dataclasses.dataclass(frozen=True)
class DenseBatch:
    req_pool_indices: torch.Tensor
    prefix_lens: list[int]
    extend_lens: list[int]


class DenseExtend(ExtendPath[DenseBatch]):
    def __init__(self, backend: FlashInferAttnBackend, config: PrefillExtConfig) -> None:
        super().__init__(backend, config, GatheredPrefill(backend.workspace_buffer))

    def _decide(self, forward_batch: ForwardBatch) -> DenseBatch | None:
        lens = batch_lens(forward_batch)
        if (
            lens is None
            or max(lens[1]) < self._config.dense_min_extend
            or not backend_supported(self._backend)
        ):
            return None
        return DenseBatch(forward_batch.req_pool_indices, *lens)

    def _num_tokens(self, plan: DenseBatch) -> int:
        return sum(plan.extend_lens)

    def _plan(self, plan: DenseBatch, layer: RadixAttention, dtype: torch.dtype) -> None:
        self._attention.plan(
            self._backend.req_to_token_pool.req_to_token,
            plan.req_pool_indices,
            plan.prefix_lens,
            plan.extend_lens,
            layer.tp_q_head_num,
            layer.tp_k_head_num,
            layer.head_dim,
            dtype,
            layer.scaling,
            layer.logit_cap,
        )
