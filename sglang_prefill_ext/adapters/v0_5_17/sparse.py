"""Block-sparse prefill as an extend path of SGLang 0.5.17's FlashInfer and fa3 backends, which differ only in
`ExtendHost`.

A plain extend batch with a request of at least `sparse_min_len` tokens (prefix + new) that brings at
least `sparse_min_extend` new ones goes sparse (a cache hit over a long prefix is not worth a plan):
every layer the policy takes (`SparsePrefill.takes`: past `--prefill-ext-sparse-dense-layers`, the
forward not declined) writes its K/V to the pool as the backend does, then attends over the pool through
the block-sparse policy (`SparsePrefill.attend`, ops/policy.py: the kept blocks over the block layout of
prefix and chunk alike, see `sglang_prefill_ext.ops.layout`, on FlashInfer's paged prefill kernel); any
other layer runs the backend's own attention. The pool is the same for both backends (`[slots, Hkv, D]`
per layer, slots from `req_to_token`), whatever the page size. The policy decides the dense layers, the
per-layer reuse of the first selection and the decline (`--prefill-ext-sparse-max-density`,
`--prefill-ext-sparse-guard`): a declined batch runs the backend's own attention from that layer on.

A path's lifecycle per extend batch:

1. `wants(forward_batch)` — the decision, made once per batch and remembered. Taking a batch means
   host-side planning, so a taken batch must run without a prefill CUDA graph: the backend's
   `wants_eager_prefill` is `wants`, which the graph runner asks before `init_forward_metadata`.
2. `begin(forward_batch)` in `init_forward_metadata` (None under graph capture: take nothing).
3. `runs(q, k, layer, forward_batch)` / `forward(...)` in `forward_extend`: for the taken batch and the
   policy's plain causal self-attention layers, write K/V to the pool as the backend does, then attend over
   the pool. Any other batch (e.g. a graph replay's static batch) or layer runs the backend's own
   attention, so a missing `wants_eager_prefill` hook costs speed, never correctness. `forward` returns
   None when the policy declines the batch: from that layer on the backend's own attention runs (the
   layer's K/V are already in the pool).

Observability: at INFO, one log line per sparse forward with the kept-block density of its selection (one
host read-back per forward, after its first sparse layer) and, with the guard on, its guard statistic;
one more line per later layer the guard checks (its statistic, and whether it declines the batch).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Protocol

import torch
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

from sglang_prefill_ext.config import PrefillExtConfig, option_name
from sglang_prefill_ext.ops import BlockLayout, SparsePrefill, context_locs

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool

logger = logging.getLogger(__name__)
GUARD_FLAG = option_name("sparse_guard")
DENSITY_FLAG = option_name("sparse_max_density")
DECLINED = ": the backend's dense prefill"


EXTEND_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)
HALF_DTYPES = (torch.bfloat16, torch.float16)


class ExtendHost(Protocol):
    """What an extend path needs from the attention backend it runs in."""

    token_to_kv_pool: KVCache
    req_to_token_pool: ReqToTokenPool

    def extend_path_supported(self) -> bool:
        """The backend's configuration lets the path read its KV pool: plain causal attention over an
        MHA pool of half-precision K/V that the backend writes as given."""
        ...

    def write_extend_kv(
        self, layer: RadixAttention, forward_batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store this layer's new K/V in the pool exactly as the backend's own extend does."""
        ...


@dataclasses.dataclass(frozen=True)
class BatchLens:
    """A plain extend batch's per-request cached prefix and new-token counts, as host ints."""

    prefix: list[int]
    extend: list[int]


def batch_lens(forward_batch: ForwardBatch) -> BatchLens | None:
    """The lens of a plain extend batch (EXTEND or MIXED), else None. From the host lists every extend
    batch carries (fa3 batches need not carry `seq_lens_cpu`)."""
    prefix_lens, extend_lens = forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu
    if forward_batch.forward_mode not in EXTEND_MODES or prefix_lens is None or not extend_lens:
        return None
    return BatchLens([int(x) for x in prefix_lens], [int(x) for x in extend_lens])


def plain_causal_layer(layer: RadixAttention) -> bool:
    """Decoder self-attention without a sliding window: what the extension's prefill path can take."""
    return (
        not layer.is_cross_attention
        and layer.attn_type == AttentionType.DECODER
        and layer.sliding_window_size in (None, -1)
    )


def prompt_lens(forward_batch: ForwardBatch) -> torch.Tensor | None:
    """Per request, on the device (no host read): the whole prompt's length. SGLang sets `orig_seq_lens` to
    it (or to the extend's end, past it): a chunk before the last ends short of it. None (every extend ends
    its prompt) when the batch carries no `orig_seq_lens`."""
    whole = forward_batch.orig_seq_lens
    if whole is None or whole.numel() != forward_batch.seq_lens.numel():
        return None
    return whole


class SparseExtend:
    """The per-batch lifecycle above over `host`, with `sparse`'s policy for every layer it takes."""

    def __init__(self, host: ExtendHost, config: PrefillExtConfig, sparse: SparsePrefill) -> None:
        self._host = host
        self._config = config
        self._start_layer = host.token_to_kv_pool.start_layer
        self.sparse = sparse
        self._decided: tuple[ForwardBatch, BatchLens | None] | None = None
        self._batch: ForwardBatch | None = None
        self._num_tokens = 0

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

    def _attend(
        self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, layer: RadixAttention
    ) -> torch.Tensor | None:
        """Block-sparse attention of one layer the policy takes; None where it declines the batch."""
        model_layer = layer.layer_id - self._start_layer
        out = self.sparse.attend(
            q, k_buffer, v_buffer, layer.scaling, layer=model_layer, logits_soft_cap=layer.logit_cap
        )
        if logger.isEnabledFor(logging.INFO):
            self._log(self.sparse.sparse_index(model_layer), declined=out is None)
        return out

    def _log(self, index: int, declined: bool) -> None:
        """The forward's line at its first sparse layer; a later one where the guard checks it (its statistic,
        and whether it declines the batch)."""
        guard = self.sparse.guard_stats.get(index)
        if guard is not None and guard < self.sparse.settings.guard:
            verdict = f" < {GUARD_FLAG}{DECLINED}"
        elif declined:
            verdict = f" > {DENSITY_FLAG}{DECLINED}"
        else:
            verdict = ""
        if index > 0:
            if guard is not None:
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

    def _decision(self, forward_batch: ForwardBatch) -> BatchLens | None:
        if self._decided is None or self._decided[0] is not forward_batch:
            lens = batch_lens(forward_batch)
            taken = lens is not None and self._host.extend_path_supported() and self._takes(lens)
            self._decided = (forward_batch, lens if taken else None)
        return self._decided[1]

    def wants(self, forward_batch: ForwardBatch) -> bool:
        """True for the extend batches this path takes (they must run without a prefill CUDA graph)."""
        return self._decision(forward_batch) is not None

    def begin(self, forward_batch: ForwardBatch | None) -> bool:
        """Take `forward_batch` if it qualifies (None: take nothing); call from `init_forward_metadata`.
        True if taken."""
        lens = None if forward_batch is None else self._decision(forward_batch)
        self._batch = None if lens is None else forward_batch
        if lens is not None:
            self._num_tokens = sum(lens.extend)
            self._begin(forward_batch, lens)
        return self._batch is not None

    def runs(
        self, q: torch.Tensor, k: torch.Tensor | None, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> bool:
        return (
            forward_batch is self._batch
            and k is not None
            and plain_causal_layer(layer)
            and self.sparse.takes(layer.layer_id - self._start_layer)
            and q.shape[0] == self._num_tokens
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool,
    ) -> torch.Tensor | None:
        """The layer's attention output [N, Hq * D], or None: declined, the backend's own attention
        runs this layer (its K/V already written) and every later one."""
        if save_kv_cache:
            self._host.write_extend_kv(layer, forward_batch, k, v)
        q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
        k_buffer, v_buffer = self._host.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        o = self._attend(q, k_buffer, v_buffer, layer)
        if o is None:
            return None
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)
