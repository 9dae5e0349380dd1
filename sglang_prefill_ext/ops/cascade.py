"""Shared-prefix cascade attention for one extend batch on FlashInfer: plan once per forward, run per layer.

The requests of an extend batch whose cached prefixes start with the same KV slots (the prefix tree
hands every request that matched the same node the same slots) attend to those `shared_len` tokens
in one pass with all their new tokens stacked as one query sequence (non-causal: every new token
comes after the whole shared prefix), and to the rest of their context (own cached remainder + new
tokens, whose K/V are already in the pool) in one paged causal pass per request. The two partial
results are merged by log-sum-exp (FlashInfer's `merge_state_in_place`), the same two-level scheme
as FlashInfer's `MultiLevelCascadeAttentionWrapper`, with one difference: when the shared prefix's
KV slots are one contiguous run, the shared pass reads them with the ragged kernel straight from the
pool (no page-table gather).

KV pools are SGLang's: per layer [T, Hkv, D] for K and for V, slots addressed as FlashInfer pages of
one token (what SGLang's FlashInfer backend does at every server page size).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from sglang_prefill_ext.ops.plan_options import plan_options

_MERGE_MAX_THREADS = 1024


@dataclasses.dataclass(frozen=True)
class CascadeIndices:
    """Where one batch's shared prefix and each request's own context live in the KV pool."""

    shared_len: int
    shared_locs: torch.Tensor  # [shared_len] int32 KV slots of the shared prefix (device)
    shared_start: int | None  # first slot when the shared slots are one contiguous run, else None
    own_qo_indptr: torch.Tensor  # [B + 1] int32 (host): each request's new tokens
    own_kv_indptr: torch.Tensor  # [B + 1] int32 (host): each request's own remainder + new tokens
    own_kv_indices: torch.Tensor  # [own tokens] int32 KV slots (device)

    @property
    def num_tokens(self) -> int:
        return int(self.own_qo_indptr[-1])

    @property
    def num_requests(self) -> int:
        return self.own_qo_indptr.numel() - 1


def shared_prefix_len(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: Sequence[int]
) -> int:
    """The longest S <= min(prefix_lens) for which every request's first S context slots are the same."""
    limit = min(prefix_lens)
    if limit == 0 or len(prefix_lens) == 1:
        return limit
    rows = req_to_token[req_pool_indices.to(req_to_token.device).long(), :limit]
    differs = (rows != rows[:1]).any(0)
    positions = torch.arange(limit, device=rows.device)
    return int(torch.where(differs, positions, limit).min())


def _contiguous_start(locs: torch.Tensor) -> int | None:
    if locs.numel() == 0:
        return None
    steps_ok = (locs[1:] - locs[:-1] == 1).all()
    ok, first = torch.stack([steps_ok.to(locs.dtype), locs[0]]).tolist()
    return first if ok else None


def build_cascade_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    shared_len: int,
) -> CascadeIndices:
    """Indices for `CascadePrefill.plan`; the first `shared_len` slots must be the same for every request."""
    if not 0 <= shared_len <= min(prefix_lens):
        raise ValueError(f"shared_len {shared_len} outside [0, {min(prefix_lens)}]")
    device = req_to_token.device
    pool_rows = req_pool_indices.to(device).long()
    own_lens = [p + n - shared_len for p, n in zip(prefix_lens, extend_lens, strict=True)]
    qo_indptr = torch.zeros(len(own_lens) + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(extend_lens, dtype=torch.int32), 0)
    kv_indptr = torch.zeros(len(own_lens) + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(own_lens, dtype=torch.int32), 0)
    total = int(kv_indptr[-1])
    lens = torch.tensor(own_lens, device=device)
    row = torch.repeat_interleave(pool_rows, lens, output_size=total)
    start = torch.repeat_interleave(kv_indptr[:-1].to(device).long(), lens, output_size=total)
    pos = torch.arange(total, device=device) + shared_len - start
    shared_locs = req_to_token[pool_rows[0], :shared_len].to(torch.int32)
    return CascadeIndices(
        shared_len,
        shared_locs,
        _contiguous_start(shared_locs),
        qo_indptr,
        kv_indptr,
        req_to_token[row, pos].to(torch.int32),
    )


def merge_supported(num_qo_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """FlashInfer's merge kernel launches head_dim / vec x num_heads threads per block (at most 1024)."""
    element_size = torch.empty(0, dtype=dtype).element_size()
    vec = max(16 // element_size, head_dim // 32)
    return (head_dim // vec) * num_qo_heads <= _MERGE_MAX_THREADS


class CascadePrefill:
    """Plan once, run per layer: a batch's new tokens over shared prefix + own context, merged by LSE."""

    def __init__(self, workspace: torch.Tensor, backend: str = "auto") -> None:
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

        self._own = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._shared_paged = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._shared_ragged = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._indices: CascadeIndices | None = None

    @property
    def indices(self) -> CascadeIndices:
        assert self._indices is not None, "plan() first"
        return self._indices

    def plan(
        self,
        indices: CascadeIndices,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
    ) -> None:
        kwargs = plan_options(dtype, sm_scale, logits_soft_cap)
        heads = (num_qo_heads, num_kv_heads, head_dim)
        self._own.plan(
            indices.own_qo_indptr,
            indices.own_kv_indptr,
            indices.own_kv_indices,
            torch.ones(indices.num_requests, dtype=torch.int32),
            *heads,
            1,
            causal=True,
            **kwargs,
        )
        self._indices = indices
        if indices.shared_len == 0:
            return
        qo_indptr = torch.tensor([0, indices.num_tokens], dtype=torch.int32)
        kv_indptr = torch.tensor([0, indices.shared_len], dtype=torch.int32)
        if indices.shared_start is not None:
            self._shared_ragged.plan(qo_indptr, kv_indptr, *heads, causal=False, **kwargs)
        else:
            ones = torch.ones(1, dtype=torch.int32)
            self._shared_paged.plan(
                qo_indptr, kv_indptr, indices.shared_locs, ones, *heads, 1, causal=False, **kwargs
            )

    def run_shared(
        self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All new tokens over the shared prefix: (output [N, Hq, D], log-sum-exp [N, Hq])."""
        start = self.indices.shared_start
        if start is None:
            return self._shared_paged.run(q, (k_buffer.unsqueeze(1), v_buffer.unsqueeze(1)), return_lse=True)
        end = start + self.indices.shared_len
        return self._shared_ragged.run(q, k_buffer[start:end], v_buffer[start:end], return_lse=True)

    def run_own(
        self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each request's new tokens over its own remainder and themselves, causal: (output, lse)."""
        return self._own.run(q, (k_buffer.unsqueeze(1), v_buffer.unsqueeze(1)), return_lse=True)

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D]; k/v_buffer: the layer's KV pool [T, Hkv, D] (new tokens written); [N, Hq, D]."""
        from flashinfer import merge_state_in_place

        out, lse = self.run_own(q, k_buffer, v_buffer)
        if self.indices.shared_len:
            merge_state_in_place(out, lse, *self.run_shared(q, k_buffer, v_buffer))
        return out
