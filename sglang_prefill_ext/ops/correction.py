"""Mean correction for pruned blocks: what the key blocks a selection drops would have added to each row.

A dropped key block c of n_c keys is summarised by its mean key k_c and mean value v_c: for query i its
attention logits' log-sum-exp is estimated as s_ic = sm_scale * q_i . k_c + ln(n_c) (the block's mean logit
plus its size: a lower bound, by Jensen, that is tight for the diffuse blocks a selection drops) and its
output as v_c. Over the row's dropped blocks (causal, not kept; the diagonal is always kept, so every
dropped block is whole) this is one softmax over pooled keys: `dropped_attention` gives its output and
log-sum-exp, `merge_states` folds it into the sparse attention's. Without it the kept blocks' weights are
renormalised as if the dropped mass were zero, which every sparse layer compounds. The idea is FlashPrefill
V2's mean correction; the cost is sm_scale-free pooled attention: per row N x C x D x 2 multiply-adds
(1/block_size of dense QK^T and PV), and one mean of K and V per key block.

Log-sum-exps are base 2, as FlashInfer's prefill kernels return them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .dispatch import FLOOR, triton_enabled
from .layout import BlockLayout
from .scorers.pooled import key_segments, segment_mean

_LOG2E = 1.4426950408889634
_FLOOR = tl.constexpr(FLOOR)


def pooled_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, layout: BlockLayout, locs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean key and value per key block of the batch ([K, Hkv, D] float32 each)."""
    segments = key_segments(layout, locs)
    return segment_mean(k_buffer, segments), segment_mean(v_buffer, segments)


@triton.jit
def _dropped_kernel(
    q_ptr,
    kbar_ptr,
    vbar_ptr,
    key_len_ptr,
    mask_ptr,
    row_req_ptr,
    row_block_ptr,
    row_q_start_ptr,
    row_q_len_ptr,
    key_offset_ptr,
    out_ptr,
    lse_ptr,
    num_rows,
    max_cols,
    stride_q_row,
    stride_q_head,
    num_qo_heads,
    num_kv_heads,
    mask_heads,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    qh = tl.program_id(1)
    group = num_qo_heads // num_kv_heads
    kvh = qh // group
    mh = qh if mask_heads == num_qo_heads else kvh
    req = tl.load(row_req_ptr + row)
    diag = tl.load(row_block_ptr + row)
    q_start = tl.load(row_q_start_ptr + row).to(tl.int64)
    q_len = tl.load(row_q_len_ptr + row)
    key_offset = tl.load(key_offset_ptr + req).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    m_offs = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_live = m_offs < q_len
    q_rows = q_start + m_offs
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_q_row + qh * stride_q_head + dims[None, :],
        mask=m_live[:, None],
        other=0.0,
    )
    best = tl.full([BLOCK_M], _FLOOR, dtype=tl.float32)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    mask_row = mask_ptr + (mh.to(tl.int64) * num_rows + row) * max_cols
    for c0 in range(0, diag, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        live = cols < diag
        kept = tl.load(mask_row + cols, mask=live, other=1) != 0
        dropped = live & ~kept
        kv_rows = (key_offset + cols) * num_kv_heads + kvh
        k = tl.load(kbar_ptr + kv_rows[:, None] * HEAD_DIM + dims[None, :], mask=dropped[:, None], other=0.0)
        v = tl.load(vbar_ptr + kv_rows[:, None] * HEAD_DIM + dims[None, :], mask=dropped[:, None], other=0.0)
        size = tl.load(key_len_ptr + key_offset + cols, mask=dropped, other=1).to(tl.float32)
        s = tl.dot(q, tl.trans(k.to(q.dtype))).to(tl.float32) * scale_log2 + tl.log2(size)[None, :]
        s = tl.where(dropped[None, :], s, _FLOOR)
        new_best = tl.maximum(best, tl.max(s, axis=1))
        p = tl.where(dropped[None, :], tl.exp2(s - new_best[:, None]), 0.0)
        alpha = tl.exp2(best - new_best)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype)).to(tl.float32)
        best = new_best
    out = acc / tl.maximum(total, 1e-30)[:, None]
    lse = tl.where(total > 0, best + tl.log2(tl.maximum(total, 1e-30)), _FLOOR)
    out_rows = q_rows * num_qo_heads + qh
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], out, mask=m_live[:, None])
    tl.store(lse_ptr + out_rows, lse, mask=m_live)


def dropped_attention_triton(
    q: torch.Tensor,
    kbar: torch.Tensor,
    vbar: torch.Tensor,
    mask: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_qo_heads, head_dim = q.shape
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_qo_heads), FLOOR, dtype=torch.float32, device=q.device)
    if layout.num_rows == 0:
        return out, lse
    block_m = 64
    grid = (layout.num_rows, num_qo_heads, triton.cdiv(layout.block_size, block_m))
    _dropped_kernel[grid](
        q,
        kbar.contiguous(),
        vbar.contiguous(),
        layout.key_len,
        mask.contiguous().view(torch.int8),
        layout.row_req,
        layout.row_block,
        layout.row_q_start,
        layout.row_q_len,
        layout.req_key_offset,
        out,
        lse,
        layout.num_rows,
        mask.shape[-1],
        q.stride(0),
        q.stride(1),
        num_qo_heads,
        kbar.shape[1],
        mask.shape[0],
        sm_scale * _LOG2E,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_C=32,
        num_warps=4,
    )
    return out, lse


def dropped_attention_torch(
    q: torch.Tensor,
    kbar: torch.Tensor,
    vbar: torch.Tensor,
    mask: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_qo_heads, head_dim = q.shape
    num_kv_heads = kbar.shape[1]
    group = num_qo_heads // num_kv_heads
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_qo_heads), FLOOR, dtype=torch.float32, device=q.device)
    for r in range(layout.num_rows):
        req, diag = int(layout.row_req[r]), int(layout.row_block[r])
        start, length = int(layout.row_q_start[r]), int(layout.row_q_len[r])
        offset = int(layout.req_key_offset[req])
        keys = slice(offset, offset + diag)
        kept = mask[:, r, :diag]  # [Hm, diag]
        dropped = ~(kept.repeat_interleave(group, 0) if kept.shape[0] == num_kv_heads else kept)
        k = kbar[keys].repeat_interleave(group, 1)  # [diag, Hq, D]
        v = vbar[keys].repeat_interleave(group, 1)
        s = torch.einsum("nhd,chd->hnc", q[start : start + length].float(), k) * (sm_scale * _LOG2E)
        s = s + torch.log2(layout.key_len[keys].float())[None, None]
        s = s.masked_fill(~dropped[:, None, :], -math.inf)
        live = dropped.any(-1)  # [Hq]
        if not bool(live.any()):
            continue
        row_lse = torch.logsumexp(s * math.log(2), -1) / math.log(2)  # [Hq, n]
        p = torch.exp2(s - row_lse[..., None]).nan_to_num(0.0)
        row_out = torch.einsum("hnc,chd->nhd", p, v)
        out[start : start + length] = torch.where(live[None, :, None], row_out, 0.0)
        lse[start : start + length] = torch.where(live[None, :], row_lse.T, FLOOR)
    return out, lse


def dropped_attention(
    q: torch.Tensor,
    kbar: torch.Tensor,
    vbar: torch.Tensor,
    mask: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pooled attention of q [N, Hq, D] over the key blocks `mask` [Hq or Hkv, R, C] drops (causal, not
    kept), from their mean keys and values `kbar`, `vbar` [K, Hkv, D]: output [N, Hq, D] and base-2
    log-sum-exp [N, Hq], float32 (FLOOR and zeros for a row that drops nothing)."""
    impl = dropped_attention_triton if triton_enabled(q) else dropped_attention_torch
    return impl(q, kbar, vbar, mask, layout, sm_scale)


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each one's output [N, H, D] and base-2
    log-sum-exp [N, H]: in out_a's dtype."""
    best = torch.maximum(lse_a, lse_b)
    wa = torch.exp2(lse_a - best)[..., None]
    wb = torch.exp2(lse_b - best)[..., None]
    return ((out_a.float() * wa + out_b.float() * wb) / (wa + wb)).to(out_a.dtype)
