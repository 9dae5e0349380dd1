"""What the extension adds to an SGLang 0.5.17 attention backend: its extend path (block-sparse
prefill, `sparse.py`) around the backend's own attention. Mixed in before the backend class by
`flashinfer.py` (FlashInfer, the default off Hopper) and `flashattention.py` (fa3, the default for MHA
models on Hopper), which give the backend-specific `ExtendHost` half.

What runs where:
- decode, target-verify, draft-extend, dLLM and anything not plain EXTEND/MIXED: the backend, untouched;
- an extend batch the path does not take, or a layer it does not take (the first dense layers,
  sliding-window, cross-attention or bidirectional layers, calls with extra inputs such as attention
  sinks), or anything under CUDA-graph capture: the backend;
- the path's layers of a batch it took: the path, until it declines the batch.

Prefill CUDA graphs: planning reads back to the host, so a taken batch cannot replay a captured prefill
graph: `wants_eager_prefill(forward_batch)` says which batches must run eagerly (the runner's
`can_run_graph` returns False for them). Batches the path does not take keep their graphs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

from sglang_prefill_ext.adapters import common
from sglang_prefill_ext.config import PrefillExtConfig

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_prefill_ext.adapters.v0_5_17.sparse import SparseExtend


def sparse_config(model_runner: ModelRunner) -> PrefillExtConfig | None:
    """The extension's options when it is on with `--prefill-ext-sparse`, else None (stock backend)."""
    config = common.prefill_ext_config(model_runner.server_args)
    return config if config is not None and config.sparse else None


class PrefillExtAttention:
    """The backend overrides both extension backends share; `ext_path` is set by their `__init__`."""

    ext_path: SparseExtend

    def wants_eager_prefill(self, forward_batch: ForwardBatch) -> bool:
        """True for the extend batches the extend path takes (no prefill CUDA graph)."""
        return self.ext_path.wants(forward_batch)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        super().init_forward_metadata(forward_batch)
        self.ext_path.begin(None if torch.cuda.is_current_stream_capturing() else forward_batch)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **extra: Any,
    ) -> torch.Tensor:
        # extra inputs (attention sinks, MLA's rope parts, FA4 biases, ...) change the attention itself
        if all(value is None for value in extra.values()) and self.ext_path.runs(q, k, layer, forward_batch):
            o = self.ext_path.forward(q, k, v, layer, forward_batch, save_kv_cache)
            if o is not None:
                return o
            save_kv_cache = False  # declined after writing this layer's K/V
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **extra)
