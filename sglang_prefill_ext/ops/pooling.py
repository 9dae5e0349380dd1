"""Mean pooling of Q and K over blocks (segments of rows).

`segment_mean(x, segments)`: out[s, h] = mean of x[rows, h] over the segment's rows, where rows are
index[start : start+length] (or start .. start+length when index is None).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .dispatch import triton_enabled
from .layout import BlockLayout


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
