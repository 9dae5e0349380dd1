"""Block attention mass from antidiagonal sums (XAttention, arXiv 2503.16428): every query row and
every key takes part, at 1/stride of QK^T's FLOPs, as one dense matmul.

With stride S, query positions i*S .. i*S+S-1 are packed into one row (in reverse order) and key
positions j*S .. j*S+S-1 into one column, so entry (i, j) of the packed product is the sum of the S
logits on the antidiagonal of that S x S tile: a vertical line (a key every query reads) and a slash
(a fixed offset) both cross every tile's antidiagonal. Scaled by sm_scale / S (the antidiagonal's mean
logit), softmaxed over the causal packed columns, summed per (query block, key block) tile and
normalised per query block, it estimates mass[h, r, c] like the sampled scorer's (sampled.py), each
row summing to 1. Per query head, or with the group's mean per KV head.

Blocks are aligned to absolute positions (layout.py); each request's queries are zero-padded to whole
query blocks and its keys to whole key blocks, and packed rows holding no query are left out. The
packed product is written once (bf16 on the GPU) and read once, by `block_lse`: each packed row's
log-sum-exp over each key block's packed columns, causal (a packed column after the packed row is
masked). Normalising and summing those per query block is a few small torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import triton_enabled
from .layout import BlockLayout

SCORE_BYTES = 1 << 29  # packed scores held at once per request (rows are processed in steps)
_FLOOR = -1.0e30


@triton.jit
def _block_lse_kernel(
    s_ptr,
    row_pos_ptr,
    out_ptr,
    num_rows,
    num_blocks,
    P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    blocks = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_live = rows < num_rows
    pos = tl.load(row_pos_ptr + rows, mask=row_live, other=-1)
    cols = blocks[None, :, None] * P + tl.arange(0, P)[None, None, :]  # [1, BLOCK_C, P]
    live = row_live[:, None, None] & (blocks < num_blocks)[None, :, None]
    s = tl.load(s_ptr + rows.to(tl.int64)[:, None, None] * (num_blocks * P) + cols, mask=live, other=0.0)
    s = tl.where(live & (cols <= pos[:, None, None]), s.to(tl.float32), float("-inf"))
    block_max = tl.max(s, axis=2)
    safe_max = tl.where(block_max == float("-inf"), 0.0, block_max)
    block_sum = tl.sum(tl.exp(s - safe_max[:, :, None]), axis=2)
    lse = tl.where(block_sum > 0, safe_max + tl.log(tl.maximum(block_sum, 1e-30)), float("-inf"))
    out = rows.to(tl.int64)[:, None] * num_blocks + blocks[None, :]
    tl.store(out_ptr + out, lse, mask=row_live[:, None] & (blocks < num_blocks)[None, :])


def block_lse_triton(s: torch.Tensor, row_pos: torch.Tensor, per_block: int) -> torch.Tensor:
    num_rows, num_cols = s.shape
    num_blocks = num_cols // per_block
    out = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=s.device)
    block_c = max(1, 256 // per_block)
    grid = (triton.cdiv(num_rows, 32), triton.cdiv(num_blocks, block_c))
    _block_lse_kernel[grid](
        s, row_pos, out, num_rows, num_blocks, P=per_block, BLOCK_R=32, BLOCK_C=block_c, num_warps=4
    )
    return out


def block_lse_torch(s: torch.Tensor, row_pos: torch.Tensor, per_block: int) -> torch.Tensor:
    num_rows, num_cols = s.shape
    cols = torch.arange(num_cols, device=s.device)
    s = s.float().masked_fill(cols[None, :] > row_pos[:, None], float("-inf"))
    return s.view(num_rows, num_cols // per_block, per_block).logsumexp(-1)


def block_lse(s: torch.Tensor, row_pos: torch.Tensor, per_block: int) -> torch.Tensor:
    """Packed scores s [N, C * per_block] (contiguous), each row's absolute packed position `row_pos`
    [N] (-1: a row without a query): log-sum-exp per key block over the packed columns up to the
    row's own, [N, C] fp32 (-inf where none is visible)."""
    impl = block_lse_triton if triton_enabled(s) else block_lse_torch
    return impl(s, row_pos.to(torch.int32).contiguous(), per_block)


def antidiagonal_mass(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    stride: int,
    sm_scale: float,
    per_query_head: bool = False,
) -> torch.Tensor:
    """q [N, Hq, D] (the batch's extend rows), keys read from the pool k_buffer [T, Hkv, D] through
    `locs` (every context position, request after request): mass [Hq or Hkv, R, max_key_blocks] fp32."""
    num_qo_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    group = num_qo_heads // num_kv_heads
    bsz = layout.block_size
    assert bsz % stride == 0, "stride must divide the block size"
    per_block = bsz // stride  # packed rows (and columns) per block
    out = torch.zeros(
        num_qo_heads, layout.num_rows, layout.max_key_blocks, dtype=torch.float32, device=q.device
    )
    first_row = q_offset = ctx_offset = 0
    for prefix, extend in zip(layout.prefix_lens, layout.extend_lens, strict=True):
        ctx = prefix + extend
        num_cols = (ctx - 1) // bsz + 1
        first_block = prefix // bsz
        num_rows = num_cols - first_block
        packed_rows = num_rows * per_block
        # [Hkv, packed columns, S*D]
        keys = torch.zeros(num_kv_heads, num_cols * bsz, head_dim, dtype=q.dtype, device=q.device)
        keys[:, :ctx] = k_buffer[locs[ctx_offset : ctx_offset + ctx].long()].transpose(0, 1)
        keys = keys.view(num_kv_heads, num_cols * per_block, stride * head_dim)
        # [Hkv, packed rows, G, S*D], scaled, each packed row's positions reversed: its dot with a
        # packed column sums the tile's antidiagonal
        queries = torch.zeros(num_rows * bsz, num_qo_heads, head_dim, dtype=q.dtype, device=q.device)
        start = prefix - first_block * bsz
        queries[start : start + extend] = q[q_offset : q_offset + extend] * (sm_scale / stride)
        queries = queries.view(packed_rows, stride, num_kv_heads, group, head_dim).flip(1)
        queries = queries.permute(2, 0, 3, 1, 4).reshape(num_kv_heads, packed_rows, group, stride * head_dim)
        row_bytes = num_qo_heads * num_cols * per_block * q.element_size()  # one packed row's scores
        step = max(1, SCORE_BYTES // (row_bytes * per_block)) * per_block
        for r0 in range(0, packed_rows, step):
            r1 = min(r0 + step, packed_rows)
            m = r1 - r0
            s = torch.matmul(queries[:, r0:r1].reshape(num_kv_heads, m * group, -1), keys.transpose(1, 2))
            packed = torch.arange(r0, r1, device=q.device) + first_block * per_block  # absolute packed row
            has_query = ((packed + 1) * stride > prefix) & (packed * stride < ctx)
            pos = torch.where(has_query, packed, -1).repeat_interleave(group).repeat(num_kv_heads)
            lse = block_lse(s.view(num_kv_heads * m * group, -1), pos, per_block)
            lse = (
                lse.view(num_kv_heads, m, group, num_cols).transpose(1, 2).reshape(num_qo_heads, m, num_cols)
            )
            p = torch.exp(lse - lse.logsumexp(-1, keepdim=True).clamp_min(_FLOOR))
            tiles = p.view(num_qo_heads, m // per_block, per_block, num_cols).sum(2)
            rows = first_row + r0 // per_block
            out[:, rows : rows + tiles.shape[1], :num_cols] = tiles
        first_row += num_rows
        q_offset += extend
        ctx_offset += ctx
    out /= out.sum(-1, keepdim=True).clamp_min(1e-30)
    if per_query_head:
        return out
    return out.view(num_kv_heads, group, layout.num_rows, layout.max_key_blocks).mean(1)
