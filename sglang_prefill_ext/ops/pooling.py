"""Mean pooling of Q and K over blocks (segments of rows), with cached key summaries honoured.

`segment_mean(x, segments)`: out[s, h] = mean of x[rows, h] over the segment's rows, where rows are
index[start : start+length] (or start .. start+length when index is None). Where slots[s] >= 0, the
segment's summary is read from cache[slots[s]] instead and its rows are never touched: that is how
a cached prefix escapes rescoring.
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
    slots: torch.Tensor | None = None
    cache: torch.Tensor | None = None

    @property
    def cached(self) -> bool:
        return self.slots is not None and self.cache is not None


@triton.jit
def _segment_mean_kernel(
    x_ptr,
    index_ptr,
    start_ptr,
    length_ptr,
    slot_ptr,
    cache_ptr,
    out_ptr,
    stride_x_row,
    stride_x_head,
    stride_cache_slot,
    stride_cache_head,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    GATHER: tl.constexpr,
    CACHED: tl.constexpr,
):
    seg = tl.program_id(0)
    head = tl.program_id(1)
    start = tl.load(start_ptr + seg).to(tl.int64)
    length = tl.load(length_ptr + seg)
    dims = tl.arange(0, HEAD_DIM)
    todo = length
    slot = -1
    if CACHED:
        slot = tl.load(slot_ptr + seg)
        todo = tl.where(slot >= 0, 0, length)
    acc = tl.zeros([BLOCK_T, HEAD_DIM], dtype=tl.float32)
    for t0 in range(0, todo, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        live = offs < todo
        rows = tl.load(index_ptr + start + offs, mask=live, other=0).to(tl.int64) if GATHER else start + offs
        ptrs = x_ptr + rows[:, None] * stride_x_row + head * stride_x_head + dims[None, :]
        acc += tl.load(ptrs, mask=live[:, None], other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / tl.maximum(length, 1).to(tl.float32)
    if CACHED:
        safe = tl.maximum(slot, 0).to(tl.int64)
        hit = (dims * 0 + slot) >= 0
        cached = tl.load(
            cache_ptr + safe * stride_cache_slot + head * stride_cache_head + dims, mask=hit, other=0.0
        )
        mean = tl.where(hit, cached.to(tl.float32), mean)
    tl.store(out_ptr + (seg * num_heads + head) * HEAD_DIM + dims, mean)


def segment_mean_triton(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    num_segments = seg.start.numel()
    _, num_heads, head_dim = x.shape
    out = torch.empty(num_segments, num_heads, head_dim, dtype=torch.float32, device=x.device)
    if num_segments == 0:
        return out
    assert x.stride(-1) == 1 and head_dim & (head_dim - 1) == 0
    cache = seg.cache if seg.cached else x
    _segment_mean_kernel[(num_segments, num_heads)](
        x,
        seg.index if seg.index is not None else seg.start,
        seg.start.contiguous(),
        seg.length.contiguous(),
        seg.slots.contiguous() if seg.cached else seg.length,
        cache,
        out,
        x.stride(0),
        x.stride(1),
        cache.stride(0),
        cache.stride(1),
        num_heads,
        HEAD_DIM=head_dim,
        BLOCK_T=32,
        GATHER=seg.index is not None,
        CACHED=seg.cached,
    )
    return out


def segment_mean_reference(x: torch.Tensor, seg: Segments) -> torch.Tensor:
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
    if seg.cached:
        hit = seg.slots >= 0
        out[hit] = seg.cache[seg.slots[hit].long()].float()
    return out


def segment_mean(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    """Mean of x's rows per segment, [S, H, D] float32 (see the module's docstring)."""
    impl = segment_mean_triton if triton_enabled(x) else segment_mean_reference
    return impl(x, seg)


def query_segments(layout: BlockLayout) -> Segments:
    """The query rows of each row block."""
    return Segments(layout.row_q_start.long(), layout.row_q_len)


def key_segments(
    layout: BlockLayout,
    locs: torch.Tensor,
    slots: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> Segments:
    """The KV-cache slots of each key block, and where given, the summary slot that stands in for them."""
    return Segments(layout.key_tok_start, layout.key_len, locs, slots, cache)


def pool_queries(q: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Mean query per row block: q [N, Hq, D] -> [R, Hq, D] float32."""
    return segment_mean(q, query_segments(layout))


def pool_keys(k_buffer: torch.Tensor, segments: Segments) -> torch.Tensor:
    """Mean key per key block of the KV pool [T, Hkv, D] -> [K, Hkv, D] float32."""
    return segment_mean(k_buffer, segments)
