"""Kept-block mask -> FlashInfer paged-prefill indices, built on the GPU.

Every (mask head h, row block r) becomes one FlashInfer "request" with the query heads h serves as
its query heads and one KV head: its query rows are rows h*N + row_q_start[r] .. of the head-major
query tensor [Hm*N, Hq/Hm, D], and its KV "pages" are single tokens of a single head, i.e. the KV pool
[T, Hkv, D] viewed without a copy as [T*Hkv, 1, 1, D], page index = loc*Hkv + KV head of h. A mask
per KV head (Hm = Hkv) lets a KV head's G query heads share one layout; a mask per query head
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
    qo_indptr: torch.Tensor  # [Hkv*R + 1] int32, host
    kv_indptr: torch.Tensor  # [Hkv*R + 1] int32, host
    kv_indices: torch.Tensor  # [nnz tokens] int32, device

    @property
    def num_segments(self) -> int:
        return self.qo_indptr.numel() - 1


def one_segment_indices(device: torch.device | str) -> PlanIndices:
    """One query row over one KV page: the smallest problem FlashInfer's planner accepts."""
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    return PlanIndices(indptr, indptr.clone(), torch.zeros(1, dtype=torch.int32, device=device))


@triton.jit
def _expand_kernel(
    locs_ptr, start_ptr, length_ptr, dest_ptr, head_ptr, out_ptr, num_kv_heads, BLOCK: tl.constexpr
):
    e = tl.program_id(0)
    start = tl.load(start_ptr + e)
    n = tl.load(length_ptr + e)
    dest = tl.load(dest_ptr + e)
    head = tl.load(head_ptr + e)
    t = tl.arange(0, BLOCK)
    live = t < n
    loc = tl.load(locs_ptr + start + t, mask=live, other=0)
    tl.store(out_ptr + dest + t, (loc * num_kv_heads + head).to(tl.int32), mask=live)


@dataclasses.dataclass(frozen=True)
class BlockRuns:
    """Kept blocks, in plan order: the tokens locs[start[e] : start[e]+length[e]] of KV head head[e]
    are written as page indices loc*num_kv_heads + head[e] to out[dest[e] : dest[e]+length[e]]."""

    locs: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    dest: torch.Tensor
    head: torch.Tensor
    num_kv_heads: int
    total: int
    block_size: int


def expand_blocks_triton(runs: BlockRuns, out: torch.Tensor | None = None) -> torch.Tensor:
    """Into `out` (at least `runs.total` int32 entries; default a new tensor of exactly that many)."""
    if out is None:
        out = torch.empty(runs.total, dtype=torch.int32, device=runs.locs.device)
    if runs.start.numel():
        _expand_kernel[(runs.start.numel(),)](
            runs.locs,
            runs.start,
            runs.length,
            runs.dest,
            runs.head,
            out,
            runs.num_kv_heads,
            BLOCK=runs.block_size,
        )
    return out


def expand_blocks_torch(runs: BlockRuns) -> torch.Tensor:
    length, total = runs.length.long(), runs.total  # the blocks are written back to back, in order
    within = torch.arange(total, device=runs.locs.device) - torch.repeat_interleave(
        torch.cumsum(length, 0) - length, length, output_size=total
    )
    pos = torch.repeat_interleave(runs.start, length, output_size=total) + within
    heads = torch.repeat_interleave(runs.head, length, output_size=total)
    return (runs.locs[pos] * runs.num_kv_heads + heads).to(torch.int32)


def build_plan_indices(
    mask: torch.Tensor, layout: BlockLayout, locs: torch.Tensor, num_kv_heads: int | None = None
) -> PlanIndices:
    """Indices for `BlockSparseAttention.plan` from a kept-block mask [Hm, R, C] (per KV head, or per query
    head: Hm a multiple of the pool's `num_kv_heads`, default Hm) and the context's KV slots."""
    num_mask_heads, num_rows, _ = mask.shape
    num_kv_heads = num_kv_heads or num_mask_heads
    head, row, col = mask.nonzero(as_tuple=True)  # sorted by (head, row, col): the plan's order
    key = layout.req_key_offset[layout.row_req[row].long()].long() + col
    length = layout.key_len[key].long()
    counts = torch.zeros(num_mask_heads * num_rows, dtype=torch.int64, device=mask.device)
    counts.index_add_(0, head * num_rows + row, length)
    kv_indptr = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(counts, 0).cpu()
    total = int(kv_indptr[-1])
    expand = expand_blocks_triton if triton_enabled(mask) else expand_blocks_torch
    runs = BlockRuns(
        locs,
        layout.key_tok_start[key],
        length,
        torch.cumsum(length, 0) - length,
        head // (num_mask_heads // num_kv_heads),
        num_kv_heads,
        total,
        layout.block_size,
    )
    kv_indices = expand(runs)
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
    """`build_plan_indices`' kv_indptr and kv_indices with no host step: every (mask head, row, column) is a
    run, empty where the mask drops it, so no `nonzero` and no read-back. Returns kv_indptr [Hm*R + 1] int32
    on the device and `out` (kv_indices from entry 0; None: a new buffer for every causal block of every
    mask head, `causal_tokens`, to pass again for the forward's later layers), whose entries past
    kv_indptr[-1] are left as they were. On CPU tensors without Triton's interpreter the expansion is
    torch's, which reads the total back."""
    num_mask_heads, num_rows, num_cols = mask.shape
    num_kv_heads = num_kv_heads or num_mask_heads
    cols = torch.arange(num_cols, device=mask.device)
    key = (layout.req_key_offset[layout.row_req.long()].long()[:, None] + cols[None, :]).clamp_max(
        layout.num_key_blocks - 1
    )
    length = torch.where(mask, layout.key_len[key].long()[None], 0).reshape(-1)
    ends = torch.cumsum(length, 0)
    kv_indptr = torch.zeros(num_mask_heads * num_rows + 1, dtype=torch.int32, device=mask.device)
    kv_indptr[1:] = ends.view(num_mask_heads * num_rows, num_cols)[:, -1]
    heads = torch.arange(num_mask_heads, device=mask.device) // (num_mask_heads // num_kv_heads)
    runs = BlockRuns(
        locs,
        layout.key_tok_start[key].expand(num_mask_heads, -1, -1).reshape(-1),
        length,
        ends - length,
        heads.repeat_interleave(num_rows * num_cols),
        num_kv_heads,
        0,
        layout.block_size,
    )
    if out is None:
        out = torch.empty(causal_tokens(layout, num_mask_heads), dtype=torch.int32, device=mask.device)
    if triton_enabled(mask):
        return kv_indptr, expand_blocks_triton(runs, out)
    indices = expand_blocks_torch(dataclasses.replace(runs, total=int(ends[-1])))
    out[: indices.numel()] = indices
    return kv_indptr, out


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
