"""Mean correction of skipped key blocks (FlashPrefill V2, arXiv 2608.19758).

A key block that a query block skips although it sees it in full (strictly before its diagonal)
enters the softmax of that query block's rows as one token: the block's mean key and mean value,
its score raised by log(n), n the block's tokens. When the block's keys are all equal that token is
exactly the block's contribution (n equal weights times the mean value); otherwise it approximates
the skipped mass instead of dropping it. The kept blocks' attention (its output and log-sum-exp) and
the mean tokens' attention are merged exactly. The mean-token attention costs queries x key blocks,
~2/block_size of a dense attention: a Triton kernel (one row block and KV head per program, its
queries x group heads packed as rows, online softmax over the block means) or the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import triton_enabled
from .layout import BlockLayout
from .pooling import key_segments, segment_mean
from .scoring import visible_blocks

_STEP_ELEMENTS = 1 << 26  # scores the torch reference holds per step


def block_means(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, layout: BlockLayout, locs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean key and mean value of every key block, read from the KV pool: [K, Hkv, D] fp32 each."""
    segments = key_segments(layout, locs)
    return segment_mean(k_buffer, segments), segment_mean(v_buffer, segments)


def skipped_visible(mask: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Key blocks each row skips though it sees them in full (before its diagonal): bool [Hkv, R, C]."""
    return ~mask & visible_blocks(layout, mask.device)[None]


@triton.jit
def _mean_token_kernel(
    q_ptr,
    kmean_ptr,
    vmean_ptr,
    skipped_ptr,
    key_len_ptr,
    row_req_ptr,
    row_block_ptr,
    row_q_start_ptr,
    row_q_len_ptr,
    key_offset_ptr,
    out_ptr,
    lse_ptr,
    num_rows,
    max_cols,
    num_qo_heads,
    num_kv_heads,
    group,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    diag = tl.load(row_block_ptr + row)
    q_start = tl.load(row_q_start_ptr + row)
    num_packed = tl.load(row_q_len_ptr + row) * group
    key_offset = tl.load(key_offset_ptr + tl.load(row_req_ptr + row))
    skipped_row = skipped_ptr + (head.to(tl.int64) * num_rows + row) * max_cols
    dims = tl.arange(0, HEAD_DIM)
    for p0 in range(0, num_packed, BLOCK_M):
        packed = p0 + tl.arange(0, BLOCK_M)
        p_live = packed < num_packed
        q_rows = (q_start + packed // group).to(tl.int64) * num_qo_heads + head * group + packed % group
        q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :], mask=p_live[:, None], other=0.0)
        q = q.to(tl.float32) * sm_scale
        run_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for c0 in range(0, diag, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            live = cols < diag
            k_rows = (key_offset + cols).to(tl.int64) * num_kv_heads + head
            k = tl.load(kmean_ptr + k_rows[:, None] * HEAD_DIM + dims[None, :], mask=live[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="tf32x3")
            skip = tl.load(skipped_row + cols, mask=live, other=0) != 0
            count = tl.load(key_len_ptr + key_offset + cols, mask=live, other=1).to(tl.float32)
            s = tl.where(p_live[:, None] & skip[None, :], s + tl.log(count)[None, :], float("-inf"))
            new_max = tl.maximum(run_max, tl.max(s, axis=1))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            p = tl.exp(s - shift[:, None])
            rescale = tl.exp(run_max - shift)
            v = tl.load(vmean_ptr + k_rows[:, None] * HEAD_DIM + dims[None, :], mask=live[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="tf32x3")
            total = total * rescale + tl.sum(p, axis=1)
            run_max = new_max
        some = total > 0
        out = acc / tl.where(some, total, 1.0)[:, None]
        lse = tl.where(some, run_max + tl.log(tl.where(some, total, 1.0)), float("-inf"))
        tl.store(out_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :], out, mask=p_live[:, None])
        tl.store(lse_ptr + q_rows, lse, mask=p_live)


def mean_token_attention_triton(
    q: torch.Tensor,
    k_mean: torch.Tensor,
    v_mean: torch.Tensor,
    skipped: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
    block_rows: int = 64,
    block_cols: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_rows` packed rows and `block_cols` key blocks per inner step (launch tuning only)."""
    num_tokens, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_mean.shape[1]
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_qo_heads), float("-inf"), dtype=torch.float32, device=q.device)
    if layout.num_rows == 0:
        return out, lse
    _mean_token_kernel[(layout.num_rows, num_kv_heads)](
        q.contiguous(),
        k_mean.contiguous(),
        v_mean.contiguous(),
        skipped.to(torch.int8).contiguous(),
        layout.key_len,
        layout.row_req,
        layout.row_block,
        layout.row_q_start,
        layout.row_q_len,
        layout.req_key_offset,
        out,
        lse,
        layout.num_rows,
        layout.max_key_blocks,
        num_qo_heads,
        num_kv_heads,
        num_qo_heads // num_kv_heads,
        sm_scale,
        HEAD_DIM=head_dim,
        BLOCK_M=block_rows,
        BLOCK_C=block_cols,
    )
    return out, lse


def mean_token_attention_reference(
    q: torch.Tensor,
    k_mean: torch.Tensor,
    v_mean: torch.Tensor,
    skipped: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_qo_heads, head_dim = q.shape
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_qo_heads), float("-inf"), dtype=torch.float32, device=q.device)
    if not skipped.any():
        return out, lse
    num_kv_heads = k_mean.shape[1]
    num_cols, block = layout.max_key_blocks, layout.block_size
    cols = torch.arange(num_cols, device=q.device)
    within = torch.arange(block, device=q.device)
    log_len = layout.key_len.float().log()
    step = max(1, _STEP_ELEMENTS // (block * num_qo_heads * num_cols))
    for r0 in range(0, layout.num_rows, step):
        rows = torch.arange(r0, min(r0 + step, layout.num_rows), device=q.device)
        live = within[None, :] < layout.row_q_len[rows].long()[:, None]  # [Rg, B]: real query slots
        tokens = torch.where(live, layout.row_q_start[rows].long()[:, None] + within, 0)
        keys = layout.req_key_offset[layout.row_req[rows].long()].long()[:, None] + cols
        keys = keys.clamp(max=k_mean.shape[0] - 1)  # columns past a request's blocks are masked below
        qg = q[tokens].float().view(len(rows), block, num_kv_heads, -1, head_dim)
        s = (
            torch.einsum("rbhgd,rchd->rhgbc", qg * sm_scale, k_mean[keys])
            + log_len[keys][:, None, None, None, :]
        )
        s = s.masked_fill(~skipped[:, rows].transpose(0, 1)[:, :, None, None, :], float("-inf"))
        step_lse = torch.logsumexp(s, -1)  # [Rg, Hkv, G, B]
        p = torch.exp(s - step_lse[..., None]).nan_to_num(0.0)  # rows with no mean token: all -inf
        o = torch.einsum("rhgbc,rchd->rbhgd", p, v_mean[keys]).flatten(2, 3)
        out[tokens[live]] = o[live]
        lse[tokens[live]] = step_lse.permute(0, 3, 1, 2).flatten(2, 3)[live]
    return out, lse


def mean_token_attention(
    q: torch.Tensor,
    k_mean: torch.Tensor,
    v_mean: torch.Tensor,
    skipped: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of every query q [N, Hq, D] over the mean tokens of its row's `skipped` blocks
    [Hkv, R, C] (score + log n). Returns out [N, Hq, D] and natural log-sum-exp [N, Hq], fp32; rows
    without a skipped block get out 0, lse -inf."""
    impl = mean_token_attention_triton if triton_enabled(q) else mean_token_attention_reference
    return impl(q, k_mean, v_mean, skipped, layout, sm_scale)


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each one's output [N, H, D] and natural
    log-sum-exp [N, H] (`lse_a` finite; `lse_b` may be -inf)."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]
