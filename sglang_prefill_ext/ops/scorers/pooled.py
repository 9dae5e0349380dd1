"""The pooled scorer: mean Q and K per block, and the blocks whose pooled score passes the threshold.

`segment_mean(x, segments)`: out[s, h] = mean of x[rows, h] over the segment's rows, where rows are
index[start : start+length] (or start .. start+length when index is None): one mean query per row block,
one mean key per key block (pooled from the KV cache). The score of query block r and key block c for
query head g is s = sm_scale * mean(q_r) . mean(k_c), exactly the mean logit over the block pair. A
block is kept when its query head's s >= max_c'(s) + log(threshold) (the estimated attention weight is
at least `threshold` of the row's best), for that query head with `settings.per_query_head` (the
default, [Hq, R, C]) or for any query head of the KV head's group ([Hkv, R, C]), or a structural rule
holds (selection.py).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..dispatch import FLOOR, triton_enabled
from ..layout import BlockLayout
from ..selection import is_dense_row, structural_blocks, structural_cols
from ..settings import SparseSettings


@dataclasses.dataclass(frozen=True)
class Segments:
    """Which rows of x each output averages (see the module's docstring)."""

    start: torch.Tensor
    length: torch.Tensor
    index: torch.Tensor | None = None


@triton.jit
def _segment_mean_kernel(
    x_ptr,
    index_ptr,
    start_ptr,
    length_ptr,
    out_ptr,
    stride_x_row,
    stride_x_head,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    GATHER: tl.constexpr,
):
    seg = tl.program_id(0)
    head = tl.program_id(1)
    start = tl.load(start_ptr + seg).to(tl.int64)
    length = tl.load(length_ptr + seg)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_T, HEAD_DIM], dtype=tl.float32)
    for t0 in range(0, length, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        live = offs < length
        rows = tl.load(index_ptr + start + offs, mask=live, other=0).to(tl.int64) if GATHER else start + offs
        ptrs = x_ptr + rows[:, None] * stride_x_row + head * stride_x_head + dims[None, :]
        acc += tl.load(ptrs, mask=live[:, None], other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / tl.maximum(length, 1).to(tl.float32)
    tl.store(out_ptr + (seg * num_heads + head) * HEAD_DIM + dims, mean)


def segment_mean_triton(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    num_segments = seg.start.numel()
    _, num_heads, head_dim = x.shape
    out = torch.empty(num_segments, num_heads, head_dim, dtype=torch.float32, device=x.device)
    if num_segments == 0:
        return out
    assert x.stride(-1) == 1 and head_dim & (head_dim - 1) == 0
    _segment_mean_kernel[(num_segments, num_heads)](
        x,
        seg.index if seg.index is not None else seg.start,
        seg.start.contiguous(),
        seg.length.contiguous(),
        out,
        x.stride(0),
        x.stride(1),
        num_heads,
        HEAD_DIM=head_dim,
        BLOCK_T=32,
        GATHER=seg.index is not None,
    )
    return out


def segment_mean_torch(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    length = seg.length.long()
    total = int(length.sum())
    num = seg.start.numel()
    which = torch.repeat_interleave(torch.arange(num, device=x.device), length, output_size=total)
    pos = (
        seg.start.long()[which]
        + torch.arange(total, device=x.device)
        - (torch.cumsum(length, 0) - length)[which]
    )
    rows = seg.index.long()[pos] if seg.index is not None else pos
    out = torch.zeros(num, *x.shape[1:], dtype=torch.float32, device=x.device)
    out.index_add_(0, which, x[rows].float())
    out /= length.clamp(min=1).to(out.dtype)[:, None, None]
    return out


def segment_mean(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    """Mean of x's rows per segment, [S, H, D] float32 (see the module's docstring)."""
    impl = segment_mean_triton if triton_enabled(x) else segment_mean_torch
    return impl(x, seg)


def query_segments(layout: BlockLayout) -> Segments:
    """The query rows of each row block."""
    return Segments(layout.row_q_start.long(), layout.row_q_len)


def key_segments(layout: BlockLayout, locs: torch.Tensor) -> Segments:
    """The KV-cache slots of each key block."""
    return Segments(layout.key_tok_start, layout.key_len, locs)


def pool_queries(q: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Mean query per row block: q [N, Hq, D] -> [R, Hq, D] float32."""
    return segment_mean(q, query_segments(layout))


def pool_keys(k_buffer: torch.Tensor, segments: Segments) -> torch.Tensor:
    """Mean key per key block of the KV pool [T, Hkv, D] -> [K, Hkv, D] float32."""
    return segment_mean(k_buffer, segments)


@triton.jit
def _scores(q, kpool_ptr, key_offset, cols, num_cols, num_kv_heads, head, HEAD_DIM: tl.constexpr):
    """Scaled pooled scores [GROUP_PAD, BLOCK_C] of the row's query heads against key blocks `cols`."""
    c_live = cols < num_cols
    dims = tl.arange(0, HEAD_DIM)
    k_rows = (key_offset + cols) * num_kv_heads + head
    k = tl.load(kpool_ptr + k_rows[:, None] * HEAD_DIM + dims[None, :], mask=c_live[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="tf32x3")
    return tl.where(c_live[None, :], s, float("-inf"))


@triton.jit
def _select_kernel(
    qpool_ptr,
    kpool_ptr,
    row_req_ptr,
    row_block_ptr,
    key_offset_ptr,
    num_keys_ptr,
    ends_prompt_ptr,
    out_ptr,
    num_rows,
    max_cols,
    num_qo_heads,
    num_kv_heads,
    group,
    sm_scale,
    log_threshold,
    sink_blocks,
    local_blocks,
    last_blocks,
    HEAD_DIM: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PER_QUERY_HEAD: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.load(row_req_ptr + row)
    diag = tl.load(row_block_ptr + row)
    key_offset = tl.load(key_offset_ptr + req).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    g = tl.arange(0, GROUP_PAD)
    g_live = g < group
    q_rows = row.to(tl.int64) * num_qo_heads + head * group + g
    q = tl.load(qpool_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :], mask=g_live[:, None], other=0.0)
    q = q * sm_scale
    num_cols = diag + 1
    best = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    for c0 in range(0, num_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        s = _scores(q, kpool_ptr, key_offset, cols, num_cols, num_kv_heads, head, HEAD_DIM)
        best = tl.maximum(best, tl.max(s, axis=1))
    dense_row = is_dense_row(diag, req, num_keys_ptr, ends_prompt_ptr, last_blocks)
    out_row = out_ptr + (head.to(tl.int64) * num_rows + row) * max_cols
    q_out_rows = out_ptr + ((head * group + g).to(tl.int64) * num_rows + row) * max_cols
    for c0 in range(0, num_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        c_live = cols < num_cols
        s = _scores(q, kpool_ptr, key_offset, cols, num_cols, num_kv_heads, head, HEAD_DIM)
        passed = ((s - best[:, None]) >= log_threshold) & g_live[:, None]
        structural = structural_cols(cols, diag, dense_row, sink_blocks, local_blocks)
        if PER_QUERY_HEAD:
            keep = passed | structural[None, :]
            live = g_live[:, None] & c_live[None, :]
            tl.store(q_out_rows[:, None] + cols[None, :], (keep & live).to(tl.int8), mask=live)
        else:
            keep = (tl.max(passed.to(tl.int32), axis=0) > 0) | structural
            tl.store(out_row + cols, (keep & c_live).to(tl.int8), mask=c_live)


def select_pooled_triton(
    qpool: torch.Tensor,
    kpool: torch.Tensor,
    layout: BlockLayout,
    settings: SparseSettings,
    sm_scale: float,
    block_cols: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`block_cols` key blocks per inner step (launch tuning only)."""
    num_rows, num_qo_heads, head_dim = qpool.shape
    num_kv_heads = kpool.shape[1]
    group = num_qo_heads // num_kv_heads
    heads = num_qo_heads if settings.per_query_head else num_kv_heads
    out = torch.zeros(heads, num_rows, layout.max_key_blocks, dtype=torch.int8, device=qpool.device)
    if num_rows == 0:
        return out.view(torch.bool)
    _select_kernel[(num_rows, num_kv_heads)](
        qpool.contiguous(),
        kpool.contiguous(),
        layout.row_req,
        layout.row_block,
        layout.req_key_offset,
        layout.req_num_key_blocks,
        layout.req_ends_prompt.view(torch.int8),
        out,
        num_rows,
        layout.max_key_blocks,
        num_qo_heads,
        num_kv_heads,
        group,
        sm_scale,
        max(settings.log_threshold, FLOOR),
        settings.sink_blocks,
        settings.local_blocks,
        settings.last_blocks,
        HEAD_DIM=head_dim,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_C=block_cols,
        PER_QUERY_HEAD=settings.per_query_head,
        num_warps=num_warps,
    )
    return out.view(torch.bool)


def pooled_scores(
    qpool: torch.Tensor, kpool: torch.Tensor, layout: BlockLayout, sm_scale: float
) -> torch.Tensor:
    """Pooled scores s [Hq, R, max_key_blocks], -inf outside each row's causal blocks."""
    num_rows, num_qo_heads, _ = qpool.shape
    num_kv_heads = kpool.shape[1]
    group = num_qo_heads // num_kv_heads
    cols = torch.arange(layout.max_key_blocks, device=qpool.device)
    idx = (layout.row_key_offset.long()[:, None] + cols).clamp(max=kpool.shape[0] - 1)
    k = kpool[idx].repeat_interleave(group, dim=2)  # [R, C, Hq, D]
    s = torch.einsum("rhd,rchd->hrc", qpool.float() * sm_scale, k.float())
    causal = cols[None, :] <= layout.row_block.long()[:, None]
    return s.masked_fill(~causal, float("-inf"))


def select_pooled_torch(
    qpool: torch.Tensor, kpool: torch.Tensor, layout: BlockLayout, settings: SparseSettings, sm_scale: float
) -> torch.Tensor:
    num_kv_heads = kpool.shape[1]
    s = pooled_scores(qpool, kpool, layout, sm_scale)
    num_qo_heads, num_rows, num_cols = s.shape
    causal = torch.isfinite(s[0])
    best = s.amax(-1, keepdim=True)
    passed = (s - best) >= settings.log_threshold
    if not settings.per_query_head:
        passed = passed.view(num_kv_heads, -1, num_rows, num_cols).any(1)
    return (passed & causal[None]) | structural_blocks(layout, settings, s.device)[None]


def select_pooled(
    qpool: torch.Tensor, kpool: torch.Tensor, layout: BlockLayout, settings: SparseSettings, sm_scale: float
) -> torch.Tensor:
    """Kept blocks, bool [Hq or Hkv, R, max_key_blocks] (see the module's docstring)."""
    impl = select_pooled_triton if triton_enabled(qpool) else select_pooled_torch
    return impl(qpool, kpool, layout, settings, sm_scale)
