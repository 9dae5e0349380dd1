"""The per-batch lifecycle of an extension extend path inside an SGLang 0.5.17 attention backend; the
same for the FlashInfer and the FlashAttention (fa3) backend, which differ only in `ExtendHost`.

A path's lifecycle per extend batch:

1. `wants(forward_batch)` — the decision, made once per batch and remembered. Taking a batch means
   host-side planning, so a taken batch must run without a prefill CUDA graph: the backend's
   `wants_eager_prefill` is `wants`, which the graph runner asks before `init_forward_metadata`.
2. `begin(forward_batch)` in `init_forward_metadata` (None under graph capture: take nothing).
3. `runs(q, k, layer, forward_batch)` / `forward(...)` in `forward_extend`: for the taken batch and the
   path's plain causal self-attention layers, write K/V to the pool as the backend does, then attend over
   the pool. Any other batch (e.g. a graph replay's static batch) or layer runs the backend's own
   attention, so a missing `wants_eager_prefill` hook costs speed, never correctness. `forward` returns
   None when the path declines the batch: from that layer on the backend's own attention runs (the
   layer's K/V are already in the pool).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import torch
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool

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


class ExtendPath:
    """Subclasses give `_takes(lens)` (the decision on a plain extend batch the backend supports),
    `_begin(forward_batch, lens)`, `_takes_layer(layer)` and `_attend(q, k_buffer, v_buffer, layer)`."""

    def __init__(self, host: ExtendHost) -> None:
        self._host = host
        self._decided: tuple[ForwardBatch, BatchLens | None] | None = None
        self._batch: ForwardBatch | None = None
        self._num_tokens = 0

    def _takes(self, lens: BatchLens) -> bool:
        raise NotImplementedError

    def _begin(self, forward_batch: ForwardBatch, lens: BatchLens) -> None:
        raise NotImplementedError

    def _takes_layer(self, layer: RadixAttention) -> bool:
        raise NotImplementedError

    def _attend(
        self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, layer: RadixAttention
    ) -> torch.Tensor | None:
        raise NotImplementedError

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
            and self._takes_layer(layer)
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
            self._batch = None
            return None
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)
