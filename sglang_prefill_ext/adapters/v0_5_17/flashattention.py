"""SGLang 0.5.17's FlashAttention backend (`--attention-backend fa3`, the default for MHA models on
Hopper) with the extension's extend path (`attention.py`).

The path needs nothing of fa3's own metadata: fa3 reads K/V through a page table built from the same
`req_to_token` rows and pool the path reads (`[slots, Hkv, D]` per layer, slot = page * page_size +
offset), so the kept blocks are planned over the pool exactly as under FlashInfer. What fa3 lacks
is FlashInfer's float workspace for those plans: the subclass takes the process's shared
"flashinfer_workspace" buffer (the one SGLang's FlashInfer backend allocates), so that exists once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from sglang.srt.environ import envs
from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.runtime_context import get_buffer

from sglang_prefill_ext.adapters.v0_5_17.attention import PrefillExtAttention, sparse_config
from sglang_prefill_ext.adapters.v0_5_17.sparse import HALF_DTYPES, SparseExtend
from sglang_prefill_ext.config import PrefillExtConfig

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


def flashinfer_workspace(device: torch.device | str) -> torch.Tensor:
    """SGLang's process-wide FlashInfer workspace, created as its FlashInfer backend creates it."""
    size = envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get()
    return get_buffer("flashinfer_workspace", lambda: torch.empty(size, dtype=torch.uint8, device=device))


class PrefillExtFlashAttentionBackend(PrefillExtAttention, FlashAttentionBackend):
    def __init__(self, model_runner: ModelRunner, config: PrefillExtConfig) -> None:
        super().__init__(model_runner)
        self.ext_path = SparseExtend.build(self, config, flashinfer_workspace(model_runner.device))

    def extend_path_supported(self) -> bool:
        """Plain fa3 prefill over an MHA pool: no MLA, chunked-local, sliding-window or encoder-decoder
        attention, no context parallelism, K/V written to the pool (not the embedding-only shortcut), no
        deterministic single split (sparse results are not batch-invariant), bf16/fp16 KV as given."""
        return (
            self.fa_impl_ver == 3
            and not self.use_mla
            and not self.has_local_attention
            and not self.has_swa
            and not self.use_sliding_window_kv_pool
            and not self.is_encoder_decoder
            and self.attn_cp_size == 1
            and not self.fa_skip_kv_cache
            and self.num_splits == 0
            and self.kv_cache_dtype_str == "auto"
            and self.kv_cache_dtype in HALF_DTYPES
        )

    def write_extend_kv(
        self, layer: RadixAttention, forward_batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        loc = KVWriteLoc(forward_batch.out_cache_loc, self.forward_metadata.swa_out_cache_loc)
        self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, layer.k_scale, layer.v_scale)


def create_backend(model_runner: ModelRunner) -> FlashAttentionBackend:
    """The fa3 backend: the extension's with `--prefill-ext-sparse`, SGLang's own otherwise (what the
    registry's `create_flashattention_v3_backend` builds on CUDA)."""
    config = sparse_config(model_runner)
    if config is None:
        return FlashAttentionBackend(model_runner)
    return PrefillExtFlashAttentionBackend(model_runner, config)
