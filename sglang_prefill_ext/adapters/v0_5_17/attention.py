"""SGLang 0.5.17's FlashInfer attention backend with block-sparse prefill for long extend batches.

What runs where:
- decode, target-verify, draft-extend, dLLM and anything not plain EXTEND/MIXED: stock, untouched;
- an extend batch without a request that has both `sparse_min_len` tokens (prefix + new) and
  `sparse_min_extend` new tokens: stock (a cache hit over a long prefix is not worth a plan);
- a sparse batch: its first `sparse_dense_layers` layers run stock; every later layer writes its
  K/V to the pool as stock does, then attends over the pool through the block-sparse layout
  (prefix and chunk alike, see `sglang_prefill_ext.ops.layout`). By default every sparse layer
  scores and plans its own layout; with `sparse_per_layer` off the first sparse layer's layout is
  shared by all later layers.
- not sparse: `--prefill-ext-cascade` and `--prefill-ext-dense` batches, in that order, take their
  paths (`cascade.py`, `dense.py`; the shared lifecycle in `extend_path.py`).
- Not sparse (stock instead): sliding-window or cross-attention models, encoder-only layers,
  multi-item scoring, FP4/FP8 KV caches (FlashInfer's scale path), and anything under CUDA-graph capture.

Prefill CUDA graphs: planning reads kv_indptr back to the host, so a sparse batch cannot replay a
captured prefill graph. `wants_eager_prefill(forward_batch)` says which batches must run eagerly
(the runner's `can_run_graph` must return False for them); as a second line of defence,
`forward_extend` runs stock attention whenever the batch it is handed is not the one planned in
`init_forward_metadata` (a graph replay hands in its static batch), so a missing hook costs speed,
never correctness. Batches no path takes keep their graphs.

Observability: at INFO, one log line per sparse forward with the kept-block density of its layout
(one host read-back per forward, after its first sparse layer).

Key summaries (pooled scorer only): the pooled key of every full block is kept per KV slot (`KeySummaryCache`), written
when a sparse forward completes the block and forgotten as soon as its first KV slot is written
again: the model runner calls `release_kv_slots(out_cache_loc)` before every forward (the patched
`_forward_raw`), eager or replayed.
A stale summary can only mis-steer block selection, never the attention arithmetic over kept blocks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

from sglang_prefill_ext.adapters import common
from sglang_prefill_ext.adapters.v0_5_17.cascade import CascadeExtend
from sglang_prefill_ext.adapters.v0_5_17.dense import DenseExtend
from sglang_prefill_ext.adapters.v0_5_17.extend_path import (
    EXTEND_MODES,
    HALF_DTYPES,
    plain_causal_layer,
    write_kv,
)
from sglang_prefill_ext.config import OPTIONS_DEST, PrefillExtConfig
from sglang_prefill_ext.ops import (
    BlockLayout,
    BlockSparsePrefill,
    KeySummaryCache,
    SparsePrefill,
    SparseSettings,
    context_locs,
)

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def sparse_settings(config: PrefillExtConfig) -> SparseSettings:
    return SparseSettings(
        block_size=config.sparse_block_size,
        scorer=config.sparse_scorer,
        mass=config.sparse_mass,
        samples=config.sparse_samples,
        threshold=config.sparse_threshold,
        sink_blocks=config.sparse_sink_blocks,
        local_blocks=config.sparse_local_blocks,
        last_blocks=config.sparse_last_blocks,
    )


class PrefillExtFlashInferBackend(FlashInferAttnBackend):
    """Stock FlashInfer backend plus, for extend batches, in this precedence: block-sparse attention for
    long ones, shared-prefix cascade attention for batches over one cached prefix, gathered dense
    attention for batches with many new tokens."""

    def __init__(self, model_runner: ModelRunner, config: PrefillExtConfig, **kwargs) -> None:
        super().__init__(model_runner, **kwargs)
        self.ext_config = config
        pool = self.token_to_kv_pool
        self._first_sparse_layer = pool.start_layer + config.sparse_dense_layers
        summaries = None
        if config.sparse and config.sparse_summaries and config.sparse_scorer != "sampled":
            scoring_layers = (
                max(1, pool.layer_num - config.sparse_dense_layers) if config.sparse_per_layer else 1
            )
            summaries = KeySummaryCache(
                pool.size + pool.page_size,
                scoring_layers,
                pool.head_num,
                pool.head_dim,
                config.sparse_block_size,
                model_runner.device,
            )
        self.sparse = SparsePrefill(
            sparse_settings(config), BlockSparsePrefill(self.workspace_buffer), summaries
        )
        self._sparse_batch: ForwardBatch | None = None
        self.cascade = CascadeExtend(self, config) if config.cascade else None
        self.dense = DenseExtend(self, config) if config.dense else None
        self._paths = [path for path in (self.cascade, self.dense) if path is not None]

    def wants_eager_prefill(self, forward_batch: ForwardBatch) -> bool:
        """True for the extend batches that take the sparse, cascade or dense path (no prefill CUDA graph)."""
        return self._wants_sparse(forward_batch) or any(path.wants(forward_batch) for path in self._paths)

    def _wants_sparse(self, forward_batch: ForwardBatch) -> bool:
        config = self.ext_config
        if not (config.sparse and forward_batch.forward_mode in EXTEND_MODES):
            return False
        extend_lens = forward_batch.extend_seq_lens_cpu
        if (
            forward_batch.extend_prefix_lens_cpu is None
            or forward_batch.seq_lens_cpu is None
            or not extend_lens
        ):
            return False
        supported = (
            self.dispatch_reason is None
            and not self.enable_mis
            and not self.prefill_uses_dequant_workspace
            and self.flashinfer_kv_cache_dtype in HALF_DTYPES
        )
        return supported and any(
            seq_len >= config.sparse_min_len and int(new) >= config.sparse_min_extend
            for seq_len, new in zip(forward_batch.seq_lens_cpu.tolist(), extend_lens, strict=True)
        )

    def release_kv_slots(self, locs: torch.Tensor) -> None:
        """Forget key summaries whose block starts at one of these KV slots (freed or rewritten)."""
        if self.sparse.summaries is not None and locs.numel():
            self.sparse.summaries.release(locs)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        super().init_forward_metadata(forward_batch)
        self._sparse_batch = None
        if torch.cuda.is_current_stream_capturing():
            return
        sparse = self._wants_sparse(forward_batch)
        # Cascade yields to sparse; the dense path also serves a sparse batch's dense layers and a
        # layout too dense to pay (see forward_extend).
        offered: ForwardBatch | None = forward_batch
        if self.cascade is not None and self.cascade.begin(None if sparse else offered):
            offered = None
        if self.dense is not None:
            self.dense.begin(offered)
        if not sparse:
            return
        layout = BlockLayout.build(
            [int(x) for x in forward_batch.extend_prefix_lens_cpu],
            [int(x) for x in forward_batch.extend_seq_lens_cpu],
            self.ext_config.sparse_block_size,
            forward_batch.seq_lens.device,
        )
        locs = context_locs(layout, self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices)
        self.sparse.begin(layout, locs)
        self._sparse_batch = forward_batch

    def _runs_sparse(
        self, q: torch.Tensor, k: torch.Tensor | None, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> bool:
        return (
            forward_batch is self._sparse_batch
            and k is not None
            and layer.layer_id >= self._first_sparse_layer
            and plain_causal_layer(layer)
            and q.shape[0] == self.sparse.layout.num_tokens
        )

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if self._runs_sparse(q, k, layer, forward_batch):
            o = self._forward_sparse(q, k, v, layer, forward_batch, save_kv_cache)
            if o is not None:
                return o
            # the layout was declined (too dense): K/V are in the pool, this and later layers run dense
            save_kv_cache = False
        for path in self._paths:
            if path.runs(q, k, layer, forward_batch):
                return path.forward(q, k, v, layer, forward_batch, save_kv_cache)
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def _forward_sparse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool,
    ) -> torch.Tensor | None:
        """Block-sparse attention of one layer; None when the first sparse layer's layout keeps more
        than `sparse_max_density` of its causal blocks and the dense path can take the batch instead."""
        if save_kv_cache:
            write_kv(self, layer, forward_batch, k, v)
        config = self.ext_config
        per_layer = config.sparse_per_layer
        first = layer.layer_id == self._first_sparse_layer
        q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
        k_buffer, v_buffer = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        if per_layer or not self.sparse.planned:
            can_decline = first and self.dense is not None and self.dense.wants(forward_batch)
            planned = self.sparse.select_and_plan(
                q,
                k_buffer,
                layer.scaling,
                summary_layer=layer.layer_id - self._first_sparse_layer if per_layer else 0,
                logits_soft_cap=layer.logit_cap,
                max_density=config.sparse_max_density if can_decline else 1.0,
            )
            if first and logger.isEnabledFor(logging.INFO):
                layout = self.sparse.layout
                logger.info(
                    "prefill-ext sparse: %d requests, %d new tokens, %d key blocks, density %.3f%s",
                    layout.req_ctx_len.numel(),
                    layout.num_tokens,
                    layout.num_key_blocks,
                    self.sparse.density(),
                    "" if planned else " > --prefill-ext-sparse-max-density: dense path",
                )
            if not planned:
                self._sparse_batch = None
                return None
        o = self.sparse.attention.run(q, k_buffer, v_buffer)
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)


def create_backend(model_runner: ModelRunner) -> FlashInferAttnBackend:
    """The non-MLA FlashInfer backend: the extension's when it is on with `--prefill-ext-sparse`,
    `--prefill-ext-cascade` or `--prefill-ext-dense`, SGLang's own otherwise (the registry's
    `create_flashinfer_backend`)."""
    server_args = model_runner.server_args
    kwargs = {"init_new_workspace": model_runner.init_new_workspace}
    if not common.extension_enabled(server_args):
        return FlashInferAttnBackend(model_runner, **kwargs)
    config = PrefillExtConfig.from_options(getattr(server_args, OPTIONS_DEST, None))
    if not (config.sparse or config.cascade or config.dense):
        return FlashInferAttnBackend(model_runner, **kwargs)
    return PrefillExtFlashInferBackend(model_runner, config, **kwargs)
