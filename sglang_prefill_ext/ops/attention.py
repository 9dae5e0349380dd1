"""Block-sparse prefill attention on FlashInfer's paged prefill kernel, over the KV pool in place.

The kernel FlashInfer's `VariableBlockSparseAttentionWrapper` runs, fed directly: no per-layer
copy of K/V into a head-major layout (the pool is viewed as one-token, one-head pages, see plan.py),
only the queries are moved to head-major order and the output back. The plan (FlashInfer's host-side
work split) is made once and can be run by every layer that keeps the same blocks (the same mask).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import warnings

import torch

from .plan import PlanIndices, one_segment_indices


def to_head_major(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[N, Hq, D] -> [Hkv*N, G, D]: the rows of KV head h are rows h*N .. h*N + N - 1."""
    n, num_qo_heads, head_dim = q.shape
    group = num_qo_heads // num_kv_heads
    return q.view(n, num_kv_heads, group, head_dim).transpose(0, 1).reshape(num_kv_heads * n, group, head_dim)


def to_token_major(o: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Inverse of `to_head_major`: [Hkv*N, G, D] -> [N, Hq, D], contiguous (with G = 1 a reshape alone would
    return a strided view)."""
    rows, group, head_dim = o.shape
    n = rows // num_kv_heads
    o = o.view(num_kv_heads, n, group, head_dim).transpose(0, 1)
    return o.contiguous().view(n, num_kv_heads * group, head_dim)


# The FlashInfer whose private wrapper fields and planner argument lists `_plan_direct` writes (the
# version SGLang 0.5.17 pins and the GPU numbers were measured with); newer ones change them.
DIRECT_PLAN_FLASHINFER = "0.6.15.post1"


@functools.cache
def direct_planning_supported() -> bool:
    """Whether the installed FlashInfer is DIRECT_PLAN_FLASHINFER; warns once when it is not."""
    try:
        found = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        found = "not installed"
    if found == DIRECT_PLAN_FLASHINFER:
        return True
    warnings.warn(
        f"flashinfer-python {found}, not {DIRECT_PLAN_FLASHINFER}: block-sparse prefill plans through "
        "FlashInfer's public plan() (slower planning at long contexts, same attention)",
        RuntimeWarning,
        stacklevel=2,
    )
    return False


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The SM count fa3's planner spreads its work over (one work list per SM)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def _int32(buffer: torch.Tensor, offset: int, count: int) -> torch.Tensor:
    """`count` int32 entries of a byte buffer from byte `offset`, as a view."""
    return buffer[offset : offset + 4 * count].view(torch.int32)


@dataclasses.dataclass(frozen=True)
class Fa3Works:
    """fa3's plan per work item (one query tile of one segment and head): the segment it serves, and the
    plan's device copies of that segment's KV start and length, which fa3's kernel reads at run time (it
    never reads the run's kv_indptr). Rewriting those two from other kv_indptr reruns the plan over other
    kept blocks of the same segments."""

    segment: torch.Tensor  # [W] int64, device
    kv_start: torch.Tensor  # [W] int32, a view into the int workspace
    kv_len: torch.Tensor  # [W] int32, a view into the int workspace

    @classmethod
    def of(cls, wrapper: object) -> Fa3Works:
        """From the wrapper's last fa3 plan: its PrefillPlanSM90Info offsets, the work count and segments
        read from the page-locked copy the planner filled on the host (FlashInfer 0.6.15.post1's layout)."""
        info = [int(x) for x in wrapper._plan_info]
        kv_start_at, kv_len_at, work_indptr_at, segment_at = info[2], info[4], info[6], info[7]
        pinned, ints = wrapper._pin_memory_int_workspace_buffer, wrapper._int_workspace_buffer
        works = int(_int32(pinned, work_indptr_at, multiprocessors(wrapper.device) + 1)[-1])
        segment = _int32(pinned, segment_at, works).to(wrapper.device, torch.int64)
        return cls(segment, _int32(ints, kv_start_at, works), _int32(ints, kv_len_at, works))

    def use(self, kv_indptr: torch.Tensor) -> None:
        """Point every work item at its segment's range of device `kv_indptr` [segments + 1]."""
        start = kv_indptr[self.segment]
        self.kv_start.copy_(start)
        self.kv_len.copy_(kv_indptr[self.segment + 1] - start)


class BlockSparseAttention:
    """Plan once, run per layer: causal attention of a batch's queries over kept blocks of the KV pool.

    Planning goes straight to FlashInfer's C++ planner. The wrapper's public `plan` takes the
    maximum query and KV length with Python's builtin `max` over host tensors, one Python-level
    comparison per segment: with Hkv x R segments (8 x 1024 at 128K) that loop, not the planner,
    was most of the plan time. FlashInfer's own `VariableBlockSparseAttentionWrapper` calls the
    planner the same way. The public `plan` still runs, on a one-segment problem, whenever the
    kernel signature (group size, head_dim, dtype, scale, soft cap) changes: it picks the backend and
    kernel module and keeps the run-time options; `fast=False`, or a FlashInfer other than
    DIRECT_PLAN_FLASHINFER, plans the whole batch through it.
    """

    def __init__(self, workspace: torch.Tensor, backend: str = "auto") -> None:
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper

        self._wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._num_kv_heads = 0
        self._signature: tuple[int, int, torch.dtype, float, float] | None = None
        self._reusable = False  # `use_indices` may swap the indices (see `plan`'s `reusable`)
        self._works: Fa3Works | None = None  # with a reusable fa3 plan

    @property
    def backend(self) -> str:
        """FlashInfer's kernel family: "fa2" or "fa3" once planned ("auto" resolves at the first plan)."""
        return self._wrapper._backend

    def plan(
        self,
        indices: PlanIndices,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
        fast: bool = True,
        reusable: bool = False,
    ) -> None:
        """`reusable` (direct planning): a plan that holds for any later indices with the same query rows
        (`use_indices`). fa2 is planned with the KV split off (one CTA per segment's query tile over the
        segment's whole KV range, read from the device indptr at run time); fa3 never splits the KV, and
        its per-work KV ranges are rewritten on the device (`Fa3Works`)."""
        self._num_kv_heads = num_kv_heads
        signature = (num_qo_heads // num_kv_heads, head_dim, dtype, sm_scale, logits_soft_cap)
        direct = fast and direct_planning_supported()
        if not direct:
            self._plan_public(indices, signature)
        else:
            if signature != self._signature:
                self._plan_public(one_segment_indices(self._wrapper.device), signature)
            self._plan_direct(indices, signature[0], head_dim, split_kv=not reusable)
        self._signature = signature
        self._reusable = reusable and direct
        self._works = Fa3Works.of(self._wrapper) if self._reusable and self.backend == "fa3" else None

    def _plan_public(
        self, indices: PlanIndices, signature: tuple[int, int, torch.dtype, float, float]
    ) -> None:
        group, head_dim, dtype, sm_scale, logits_soft_cap = signature
        self._wrapper.plan(
            indices.qo_indptr,
            indices.kv_indptr,
            indices.kv_indices,
            torch.ones(indices.num_segments, dtype=torch.int32),
            group,
            1,
            head_dim,
            1,
            causal=True,
            sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap or None,  # FlashInfer spells "no soft cap" None
            q_data_type=dtype,
            kv_data_type=dtype,
        )

    def _plan_direct(self, indices: PlanIndices, group: int, head_dim: int, split_kv: bool = True) -> None:
        """What the wrapper's `plan` does for a causal, page-size-1, non-graph fa2/fa3 batch, vectorised."""
        wrapper = self._wrapper
        if wrapper._backend not in ("fa2", "fa3") or wrapper.is_cuda_graph_enabled:
            raise RuntimeError(f"direct planning covers fa2/fa3 without CUDA graphs, not {wrapper._backend}")
        qo_indptr, kv_indptr = indices.qo_indptr, indices.kv_indptr
        kv_lens = kv_indptr[1:] - kv_indptr[:-1]
        num_segments, total_rows = indices.num_segments, int(qo_indptr[-1])
        device = wrapper.device
        wrapper._batch_size = num_segments
        wrapper._qo_indptr_last = total_rows
        wrapper._max_q_len = int((qo_indptr[1:] - qo_indptr[:-1]).max())
        wrapper._max_kv_len = int(kv_lens.max())
        if num_segments > wrapper._kv_lens_buffer.numel():
            wrapper._kv_lens_buffer = torch.empty(num_segments, dtype=torch.int32, device=device)
        wrapper._kv_lens_buffer[:num_segments].copy_(kv_lens, non_blocking=True)
        wrapper._qo_indptr_buf = qo_indptr.to(device, non_blocking=True)
        wrapper._paged_kv_indptr_buf = kv_indptr.to(device, non_blocking=True)
        wrapper._paged_kv_indices_buf = indices.kv_indices
        wrapper._paged_kv_last_page_len_buf = torch.ones(num_segments, dtype=torch.int32, device=device)
        args = [
            wrapper._float_workspace_buffer,
            wrapper._int_workspace_buffer,
            wrapper._pin_memory_int_workspace_buffer,
            qo_indptr,
            kv_indptr,
            kv_lens,
            total_rows,
            num_segments,
            group,  # query heads per segment
            1,  # KV heads per segment
            1,  # page size
            False,  # CUDA graph
            head_dim,
            head_dim,
            True,  # causal
            -1,  # window_left
        ]
        if wrapper._backend == "fa2":
            args += [-1, not split_kv, 0]  # fixed_split_size, disable_split_kv, num_colocated_ctas
        wrapper._plan_info = wrapper._cached_module.plan(*args)

    @property
    def reusable(self) -> bool:
        """Whether the current plan takes other indices (`use_indices`): planned reusable, directly."""
        return self._reusable

    def serves(self, problem: tuple[int, int, int, torch.dtype, float, float]) -> bool:
        """Whether `use_indices` may run the current plan for `problem`, `plan`'s arguments after the indices
        (query heads, KV heads, head_dim, dtype, scale, soft cap): reusable and made for the same ones."""
        num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, logits_soft_cap = problem
        signature = (num_qo_heads // num_kv_heads, head_dim, dtype, sm_scale, logits_soft_cap)
        return self._reusable and num_kv_heads == self._num_kv_heads and signature == self._signature

    def use_indices(self, kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> None:
        """Run the current plan over other kept blocks with the same segments (`plan.device_plan_indices`:
        device kv_indptr [segments + 1], kv_indices): no host step. Needs a plan made with reusable=True."""
        if not self._reusable:
            raise RuntimeError("use_indices needs a plan made with reusable=True (direct planning)")
        wrapper = self._wrapper
        segments = kv_indptr.numel() - 1
        wrapper._paged_kv_indptr_buf = kv_indptr
        wrapper._paged_kv_indices_buf = kv_indices
        if self._works is not None:
            self._works.use(kv_indptr)
        else:
            wrapper._kv_lens_buffer[:segments].copy_(kv_indptr[1:] - kv_indptr[:-1], non_blocking=True)

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D]; k/v_buffer: the layer's KV pool [T, Hkv, D]; returns [N, Hq, D]."""
        head_dim = q.shape[-1]
        pages = (k_buffer.view(-1, 1, 1, head_dim), v_buffer.view(-1, 1, 1, head_dim))
        out = self._wrapper.run(to_head_major(q, self._num_kv_heads), pages)
        return to_token_major(out, self._num_kv_heads)
