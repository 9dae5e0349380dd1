"""Block-sparse prefill attention on FlashInfer's paged prefill kernel, over the KV pool in place.

The kernel FlashInfer's `VariableBlockSparseAttentionWrapper` runs, fed directly: no per-layer
copy of K/V into a head-major layout (the pool is viewed as one-token, one-head pages, see plan.py),
only the queries are moved to head-major order and the output back. The plan (FlashInfer's host-side
work split) is made once and can be run by every layer that shares the layout.
"""

from __future__ import annotations

import torch

from .plan import PlanIndices


def to_head_major(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[N, Hq, D] -> [Hkv*N, G, D]: the rows of KV head h are rows h*N .. h*N + N - 1."""
    n, num_qo_heads, head_dim = q.shape
    group = num_qo_heads // num_kv_heads
    return q.view(n, num_kv_heads, group, head_dim).transpose(0, 1).reshape(num_kv_heads * n, group, head_dim)


def to_token_major(o: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Inverse of `to_head_major`: [Hkv*N, G, D] -> [N, Hq, D]."""
    rows, group, head_dim = o.shape
    n = rows // num_kv_heads
    return o.view(num_kv_heads, n, group, head_dim).transpose(0, 1).reshape(n, num_kv_heads * group, head_dim)


class BlockSparsePrefill:
    """Plan once, run per layer: causal attention of a batch's queries over kept blocks of the KV pool."""

    def __init__(self, workspace: torch.Tensor, backend: str = "auto") -> None:
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper

        self._wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._num_kv_heads = 0

    def plan(
        self,
        indices: PlanIndices,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
    ) -> None:
        self._num_kv_heads = num_kv_heads
        self._wrapper.plan(
            indices.qo_indptr,
            indices.kv_indptr,
            indices.kv_indices,
            torch.ones(indices.num_segments, dtype=torch.int32),
            num_qo_heads // num_kv_heads,
            1,
            head_dim,
            1,
            causal=True,
            sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap or None,
            q_data_type=dtype,
            kv_data_type=dtype,
        )

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D]; k/v_buffer: the layer's KV pool [T, Hkv, D]; returns [N, Hq, D]."""
        head_dim = q.shape[-1]
        pages = (k_buffer.view(-1, 1, 1, head_dim), v_buffer.view(-1, 1, 1, head_dim))
        out = self._wrapper.run(to_head_major(q, self._num_kv_heads), pages)
        return to_token_major(out, self._num_kv_heads)
