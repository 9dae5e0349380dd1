"""SGLang 0.5.17's FlashInfer backend with the extension's extend path (`attention.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_prefill_ext.adapters.v0_5_17.attention import PrefillExtAttention, sparse_config
from sglang_prefill_ext.adapters.v0_5_17.sparse import HALF_DTYPES, SparseExtend
from sglang_prefill_ext.config import PrefillExtConfig

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


class PrefillExtFlashInferBackend(PrefillExtAttention, FlashInferAttnBackend):
    def __init__(self, model_runner: ModelRunner, config: PrefillExtConfig, **kwargs) -> None:
        super().__init__(model_runner, **kwargs)
        self.ext_path = SparseExtend.build(self, config, self.workspace_buffer)

    def extend_path_supported(self) -> bool:
        """Plain FlashInfer prefill: no sliding-window or cross-attention wrappers (`dispatch_reason`), no
        multi-item scoring masks, no deterministic split (sparse results are not batch-invariant), no
        dequantising workspace, half-precision KV of the query's dtype."""
        return (
            self.dispatch_reason is None
            and not self.enable_mis
            and not self.enable_deterministic
            and not self.prefill_uses_dequant_workspace
            and self.flashinfer_kv_cache_dtype in HALF_DTYPES
            and self.flashinfer_kv_cache_dtype == self.indices_updater_prefill.q_data_type
        )

    def write_extend_kv(
        self, layer: RadixAttention, forward_batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        loc = KVWriteLoc(forward_batch.out_cache_loc, self.forward_metadata.swa_out_cache_loc)
        self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, *self._kv_write_scales(layer))


def create_backend(model_runner: ModelRunner) -> FlashInferAttnBackend:
    """The non-MLA FlashInfer backend: the extension's with `--prefill-ext-sparse`, SGLang's own
    otherwise (what the registry's `create_flashinfer_backend` builds)."""
    kwargs = {"init_new_workspace": model_runner.init_new_workspace}
    config = sparse_config(model_runner)
    if config is None:
        return FlashInferAttnBackend(model_runner, **kwargs)
    return PrefillExtFlashInferBackend(model_runner, config, **kwargs)
