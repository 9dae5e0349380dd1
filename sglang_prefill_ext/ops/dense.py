"""Dense prefill over long contexts on FlashInfer's ragged kernel: plan once per forward, run per layer.

SGLang 0.5.17 attends an extend batch's new tokens to their cached context with FlashInfer's paged
kernel on its FA2 backend (one-token pages), 320-390 TFLOP/s on the H200 over long prefixes, while the
ragged kernel over contiguous K/V takes FA3 on sm90 (640-690 TFLOP/s;
`bench/results/2026-11-29-h200-dense.md`). With many new tokens per request it pays to gather each
request's whole context (cached prefix + the new tokens, already written to the pool) into one
contiguous buffer per layer and attend in a single causal ragged pass: the gather moves
`context x Hkv x D x 4` bytes, the attention does `new x context x Hq x D x 4` FLOPs (measured: the
gather costs ~2 % of the pass with 8K-token chunks).
FlashInfer aligns a causal mask with fewer queries than keys to the bottom right: new token i of a
request with prefix p sees context positions 0..p+i, as in stock.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_prefill_ext.ops.layout import sequence_locs
from sglang_prefill_ext.ops.plan_options import plan_options


def _indptr(lens: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
    return out


class GatheredPrefill:
    """Each request's new tokens over its gathered context, one causal ragged pass per layer."""

    def __init__(self, workspace: torch.Tensor, backend: str = "auto") -> None:
        from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

        self._wrapper = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._locs: torch.Tensor | None = None
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    @property
    def locs(self) -> torch.Tensor:
        assert self._locs is not None, "plan() first"
        return self._locs

    def plan(
        self,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        prefix_lens: Sequence[int],
        extend_lens: Sequence[int],
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
    ) -> None:
        """Plan for requests with `prefix_lens[b]` cached and `extend_lens[b]` new tokens (host ints)."""
        context_lens = [p + n for p, n in zip(prefix_lens, extend_lens, strict=True)]
        kv_indptr = _indptr(context_lens)
        total = int(kv_indptr[-1])
        device = req_to_token.device
        self._locs = sequence_locs(
            req_to_token, req_pool_indices, torch.tensor(context_lens), kv_indptr[:-1].long(), total
        )
        shape = (total, num_kv_heads, head_dim)
        # kept across forwards (grown, never shrunk): one allocation per server, not per batch
        if (
            self._k is None
            or self._k.shape[0] < total
            or self._k.shape[1:] != shape[1:]
            or self._k.dtype != dtype
        ):
            self._k = torch.empty(shape, dtype=dtype, device=device)
            self._v = torch.empty(shape, dtype=dtype, device=device)
        self._wrapper.plan(
            _indptr(extend_lens),
            kv_indptr,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            causal=True,
            **plan_options(dtype, sm_scale, logits_soft_cap),
        )

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D]; k/v_buffer: the layer's KV pool [T, Hkv, D] with the new tokens written."""
        locs = self.locs
        n = locs.numel()
        k, v = self._k[:n], self._v[:n]
        torch.index_select(k_buffer, 0, locs, out=k)
        torch.index_select(v_buffer, 0, locs, out=v)
        return self._wrapper.run(q, k, v)
