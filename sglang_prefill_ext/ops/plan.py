"""Kept-block mask -> FlashInfer paged-prefill indices, built on the GPU.

Every (mask head h, row block r) becomes one FlashInfer "request" with the query heads h serves as
its query heads and one KV head: its query rows are rows h*N + row_q_start[r] .. of the head-major
query tensor [Hm*N, Hq/Hm, D], and its KV "pages" are single tokens of a single head, i.e. the KV pool
[T, Hkv, D] viewed without a copy as [T*Hkv, 1, 1, D], page index = loc*Hkv + KV head of h. A mask
per KV head (Hm = Hkv) lets a KV head's G query heads share one set of kept blocks; a mask per query head
(Hm = Hq) gives each its own, one query head per segment reading its KV head's pages. The kept blocks of
the row are listed in increasing order (the diagonal last; see layout.py), each expanded to its
tokens' page indices. The one device->host copy is kv_indptr ([Hm*R + 1] ints), which FlashInfer's
planner needs on the host anyway.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .dispatch import triton_enabled
from .layout import BlockLayout


@dataclasses.dataclass(frozen=True)
class PlanIndices:
    """One segment per (mask head, row block); Hm mask heads: query heads (the default) or KV heads."""

    qo_indptr: torch.Tensor  # [Hm*R + 1] int32, host
    kv_indptr: torch.Tensor  # [Hm*R + 1] int32, host
    kv_indices: torch.Tensor  # [nnz tokens] int32, device

    @property
    def num_segments(self) -> int:
        return self.qo_indptr.numel() - 1


def one_segment_indices(device: torch.device | str) -> PlanIndices:
    """One query row over one KV page: the smallest problem FlashInfer's planner accepts."""
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    return PlanIndices(indptr, indptr.clone(), torch.zeros(1, dtype=torch.int32, device=device))


@triton.jit
def _kept(mask_ptr, seg, max_cols, cols, num_cols):
    """Segment `seg`'s mask at key blocks `cols`, False from `num_cols` (its causal width) on."""
    live = cols < num_cols
    return live & (tl.load(mask_ptr + seg.to(tl.int64) * max_cols + cols, mask=live, other=0) != 0)


@triton.jit
def _expand_rows_kernel(
    mask_ptr,
    row_key_ptr,
    row_block_ptr,
    key_len_ptr,
    key_start_ptr,
    locs_ptr,
    indptr_ptr,
    out_ptr,
    num_rows,
    max_cols,
    heads_per_kv,
    num_kv_heads,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    seg = tl.program_id(0)  # mask head * num_rows + row: one plan segment
    kv_head = (seg // num_rows) // heads_per_kv
    row = seg % num_rows
    key0 = tl.load(row_key_ptr + row).to(tl.int64)
    num_cols = tl.load(row_block_ptr + row) + 1  # causal: up to the diagonal
    dest = tl.load(indptr_ptr + seg).to(tl.int64)
    t = tl.arange(0, BLOCK)
    for c0 in range(0, num_cols, BLOCK_C):
        # the tile's mask and block ranges in one load each; then only its kept blocks are copied, one
        # block (BLOCK tokens) per step: a sparse row costs its kept blocks, not its causal width
        c = c0 + tl.arange(0, BLOCK_C)
        kept = _kept(mask_ptr, seg, max_cols, c, num_cols)
        length = tl.load(key_len_ptr + key0 + c, mask=kept, other=0)
        start = tl.load(key_start_ptr + key0 + c, mask=kept, other=0)
        rank = tl.cumsum(kept.to(tl.int32), 0) - 1
        for j in range(tl.sum(kept.to(tl.int32), 0)):
            pick = kept & (rank == j)
            n = tl.sum(tl.where(pick, length, 0), 0)
            first = tl.sum(tl.where(pick, start, 0), 0)
            loc = tl.load(locs_ptr + first + t, mask=t < n, other=0)
            tl.store(out_ptr + dest + t, (loc * num_kv_heads + kv_head).to(tl.int32), mask=t < n)
            dest += n


@triton.jit
def _row_tokens_kernel(
    mask_ptr, row_key_ptr, row_block_ptr, key_len_ptr, out_ptr, num_rows, max_cols, BLOCK_C: tl.constexpr
):
    seg = tl.program_id(0)  # mask head * num_rows + row
    row = seg % num_rows
    key0 = tl.load(row_key_ptr + row).to(tl.int64)
    num_cols = tl.load(row_block_ptr + row) + 1
    total = tl.zeros([BLOCK_C], dtype=tl.int32)
    for c0 in range(0, num_cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        kept = _kept(mask_ptr, seg, max_cols, c, num_cols)
        total += tl.load(key_len_ptr + key0 + c, mask=kept, other=0)
    tl.store(out_ptr + seg, tl.sum(total, 0))


def _device_kv_indptr_torch(mask: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    num_mask_heads, num_rows, num_cols = mask.shape
    kv_indptr = torch.zeros(num_mask_heads * num_rows + 1, dtype=torch.int32, device=mask.device)
    cols = torch.arange(num_cols, device=mask.device)
    key = (layout.row_key_offset.long()[:, None] + cols[None, :]).clamp_max(layout.num_key_blocks - 1)
    counts = torch.where(mask, layout.key_len[key][None], 0).sum(-1, dtype=torch.int32)
    torch.cumsum(counts.view(-1), 0, out=kv_indptr[1:])
    return kv_indptr


def _device_kv_indptr_triton(mask: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    num_mask_heads, num_rows, num_cols = mask.shape
    kv_indptr = torch.zeros(num_mask_heads * num_rows + 1, dtype=torch.int32, device=mask.device)
    counts = torch.empty(num_mask_heads * num_rows, dtype=torch.int32, device=mask.device)
    _row_tokens_kernel[(counts.numel(),)](
        mask.contiguous().view(torch.int8),
        layout.row_key_offset,
        layout.row_block,
        layout.key_len,
        counts,
        num_rows,
        num_cols,
        BLOCK_C=256,
    )
    torch.cumsum(counts, 0, out=kv_indptr[1:])
    return kv_indptr


def _device_kv_indptr(mask: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """kv_indptr [Hm*R + 1] int32 of a mask's segments, on its device: each (mask head, row)'s kept tokens."""
    impl = _device_kv_indptr_triton if triton_enabled(mask) else _device_kv_indptr_torch
    return impl(mask, layout)


def _expand_rows(
    mask: torch.Tensor,
    layout: BlockLayout,
    locs: torch.Tensor,
    num_kv_heads: int,
    kv_indptr: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """Every segment's kept tokens as page indices into `out` from its device `kv_indptr` entry, one Triton
    program per (mask head, row) walking the row's causal columns, copying its kept blocks."""
    num_mask_heads, num_rows, num_cols = mask.shape
    _expand_rows_kernel[(num_mask_heads * num_rows,)](
        mask.contiguous().view(torch.int8),
        layout.row_key_offset,
        layout.row_block,
        layout.key_len,
        layout.key_tok_start,
        locs,
        kv_indptr,
        out,
        num_rows,
        num_cols,
        num_mask_heads // num_kv_heads,
        num_kv_heads,
        BLOCK=layout.block_size,
        BLOCK_C=256,
    )
    return out


def _plan_indices_triton(
    mask: torch.Tensor, layout: BlockLayout, locs: torch.Tensor, num_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_indptr (host, the one read-back) and kv_indices, expanded by `_expand_rows`."""
    device_indptr = _device_kv_indptr(mask, layout)
    kv_indptr = device_indptr.cpu()
    out = torch.empty(int(kv_indptr[-1]), dtype=torch.int32, device=mask.device)
    return kv_indptr, _expand_rows(mask, layout, locs, num_kv_heads, device_indptr, out)


def _plan_indices_torch(
    mask: torch.Tensor, layout: BlockLayout, locs: torch.Tensor, num_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_indptr (host) and kv_indices without Triton: the kept blocks by `nonzero`, expanded in torch."""
    num_mask_heads, num_rows, _ = mask.shape
    head, row, col = mask.nonzero(as_tuple=True)  # sorted by (head, row, col): the plan's order
    key = layout.row_key_offset[row].long() + col
    length = layout.key_len[key].long()
    counts = torch.zeros(num_mask_heads * num_rows, dtype=torch.int64, device=mask.device)
    counts.index_add_(0, head * num_rows + row, length)
    kv_indptr = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(counts, 0).cpu()
    total = int(kv_indptr[-1])
    within = torch.arange(total, device=mask.device) - torch.repeat_interleave(
        torch.cumsum(length, 0) - length, length, output_size=total
    )
    pos = torch.repeat_interleave(layout.key_tok_start[key], length, output_size=total) + within
    heads = torch.repeat_interleave(head // (num_mask_heads // num_kv_heads), length, output_size=total)
    return kv_indptr, (locs[pos] * num_kv_heads + heads).to(torch.int32)


def build_plan_indices(
    mask: torch.Tensor, layout: BlockLayout, locs: torch.Tensor, num_kv_heads: int | None = None
) -> PlanIndices:
    """Indices for `BlockSparseAttention.plan` from a kept-block mask [Hm, R, C] (per KV head, or per query
    head: Hm a multiple of the pool's `num_kv_heads`, default Hm) and the context's KV slots."""
    num_mask_heads = mask.shape[0]
    num_kv_heads = num_kv_heads or num_mask_heads
    impl = _plan_indices_triton if triton_enabled(mask) else _plan_indices_torch
    kv_indptr, kv_indices = impl(mask, layout, locs, num_kv_heads)
    n = layout.num_tokens
    starts = layout.row_q_start_host.long()
    qo = torch.cat([h * n + starts for h in range(num_mask_heads)] + [torch.tensor([num_mask_heads * n])])
    return PlanIndices(qo.to(torch.int32), kv_indptr, kv_indices)


def device_plan_indices(
    mask: torch.Tensor,
    layout: BlockLayout,
    locs: torch.Tensor,
    num_kv_heads: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`build_plan_indices`' kv_indptr and kv_indices with no host step (no read-back): kv_indptr [Hm*R + 1]
    int32 on the device and `out` (kv_indices from entry 0; None: a new buffer for every causal block of
    every mask head, `causal_tokens`, to pass again for the forward's later layers), whose entries past
    kv_indptr[-1] are left as they were. Without Triton (CPU tensors, no interpreter) it is
    `build_plan_indices`, read back."""
    num_mask_heads = mask.shape[0]
    num_kv_heads = num_kv_heads or num_mask_heads
    if out is None:
        out = torch.empty(causal_tokens(layout, num_mask_heads), dtype=torch.int32, device=mask.device)
    if not triton_enabled(mask):
        host = build_plan_indices(mask, layout, locs, num_kv_heads)
        out[: host.kv_indices.numel()] = host.kv_indices
        return host.kv_indptr.to(mask.device), out
    kv_indptr = _device_kv_indptr(mask, layout)
    return kv_indptr, _expand_rows(mask, layout, locs, num_kv_heads, kv_indptr, out)


def causal_tokens(layout: BlockLayout, num_mask_heads: int) -> int:
    """Page indices of a mask keeping every causal block: the size `device_plan_indices` needs at most."""
    rows_per_req = [
        (p + n - 1) // layout.block_size + 1 - p // layout.block_size
        for p, n in zip(layout.prefix_lens, layout.extend_lens, strict=True)
    ]
    total = sum(
        rows * (p + n)
        for rows, p, n in zip(rows_per_req, layout.prefix_lens, layout.extend_lens, strict=True)
    )
    return num_mask_heads * total
