"""Block-sparse prefill as an extend path of SGLang 0.5.17's FlashInfer and fa3 backends.

A plain extend batch with a request of at least `sparse_min_len` tokens (prefix + new) that brings at
least `sparse_min_extend` new ones goes sparse (a cache hit over a long prefix is not worth a plan):
its first `sparse_dense_layers` layers run the backend's own attention; every later layer writes its K/V
to the pool as the backend does, then attends over the pool through the block-sparse layout (prefix and
chunk alike, see `sglang_prefill_ext.ops.layout`) on FlashInfer's paged prefill kernel. The pool is the
same for both backends (`[slots, Hkv, D]` per layer, slots from `req_to_token`), whatever the page size.
By default every sparse layer scores and plans its own layout; with `sparse_per_layer` off the first
sparse layer's layout is shared by all later layers.

A layout that keeps more than `sparse_max_density` of its causal blocks at the first sparse layer would
not beat a dense pass (FlashInfer's block-sparse kernel costs about 1.3 x density of one): the batch is
declined there and runs the backend's own attention from that layer on. So is a batch whose selection
fails `--prefill-ext-sparse-guard` (ops/guard.py) at its first sparse layer or, with
`--prefill-ext-sparse-guard-every`, a later one: the layers before it stay sparse.

Observability: at INFO, one log line per sparse forward with the kept-block density of its layout (one
host read-back per forward, after its first sparse layer) and, with the guard on, its guard statistic;
one more line when a later layer's guard declines the batch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

from sglang_prefill_ext.adapters.v0_5_17.extend_path import BatchLens, ExtendHost, ExtendPath
from sglang_prefill_ext.config import PrefillExtConfig, option_name
from sglang_prefill_ext.ops import (
    BlockLayout,
    SparsePrefill,
    context_locs,
)

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention

logger = logging.getLogger(__name__)
GUARD_FLAG = option_name("sparse_guard")
DENSITY_FLAG = option_name("sparse_max_density")
DECLINED = ": the backend's dense prefill"


def prompt_lens(forward_batch: ForwardBatch) -> torch.Tensor | None:
    """Per request, on the device (no host read): the whole prompt's length. SGLang sets `orig_seq_lens` to
    it (or to the extend's end, past it): a chunk before the last ends short of it. None (every extend ends
    its prompt) when the batch carries no `orig_seq_lens`."""
    whole = forward_batch.orig_seq_lens
    if whole is None or whole.numel() != forward_batch.seq_lens.numel():
        return None
    return whole


class SparseExtend(ExtendPath):
    def __init__(self, host: ExtendHost, config: PrefillExtConfig, sparse: SparsePrefill) -> None:
        super().__init__(host)
        self._config = config
        self._first_layer = host.token_to_kv_pool.start_layer + config.sparse_dense_layers
        self.sparse = sparse

    @classmethod
    def build(cls, host: ExtendHost, config: PrefillExtConfig, workspace: torch.Tensor) -> SparseExtend:
        """The path over `host`'s KV pool; `workspace`: FlashInfer's float workspace for the plans."""
        return cls(host, config, SparsePrefill.create(config.sparse_settings, workspace))

    def _takes(self, lens: BatchLens) -> bool:
        config = self._config
        return any(
            prefix + new >= config.sparse_min_len and new >= config.sparse_min_extend
            for prefix, new in zip(lens.prefix, lens.extend, strict=True)
        )

    def _begin(self, forward_batch: ForwardBatch, lens: BatchLens) -> None:
        layout = BlockLayout.build(
            lens.prefix,
            lens.extend,
            self._config.sparse_settings.block_size,
            forward_batch.req_pool_indices.device,
            prompt_lens=prompt_lens(forward_batch),
        )
        req_to_token = self._host.req_to_token_pool.req_to_token
        self.sparse.begin(layout, context_locs(layout, req_to_token, forward_batch.req_pool_indices))

    def _takes_layer(self, layer: RadixAttention) -> bool:
        return layer.layer_id >= self._first_layer

    def _attend(
        self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, layer: RadixAttention
    ) -> torch.Tensor | None:
        """Block-sparse attention of one layer; None when the first sparse layer's layout keeps more than
        `sparse_max_density` of its causal blocks, or a layer the guard checks fails it."""
        config = self._config
        index = layer.layer_id - self._first_layer
        out = self.sparse.attend(
            q,
            k_buffer,
            v_buffer,
            layer.scaling,
            layer=index,
            per_layer=config.sparse_per_layer,
            max_density=config.sparse_max_density,
            logits_soft_cap=layer.logit_cap,
        )
        if logger.isEnabledFor(logging.INFO):
            self._log(index, declined=out is None)
        return out

    def _log(self, index: int, declined: bool) -> None:
        """The forward's line at its first sparse layer; a later one only where the guard declines."""
        guard = self.sparse.guard_stats.get(index)
        if guard is not None and guard < self.sparse.settings.guard:
            verdict = f" < {GUARD_FLAG}{DECLINED}"
        elif declined:
            verdict = f" > {DENSITY_FLAG}{DECLINED}"
        else:
            verdict = ""
        if index > 0:
            if verdict:
                logger.info("prefill-ext sparse: sparse layer %d, guard %.3f%s", index, guard, verdict)
            return
        layout = self.sparse.layout
        logger.info(
            "prefill-ext sparse: %d requests, %d new tokens, %d key blocks, density %.3f%s%s",
            layout.req_ctx_len.numel(),
            layout.num_tokens,
            layout.num_key_blocks,
            self.sparse.density(),
            "" if guard is None else f", guard {guard:.3f}",
            verdict,
        )
