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
query blocks and its keys to whole key blocks, and packed rows holding no query are left out.
"""

from __future__ import annotations

import torch

from .layout import BlockLayout

SCORE_BYTES = 1 << 29  # fp32 packed scores held at once per request (rows are processed in steps)


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
        keys = torch.zeros(num_cols * bsz, num_kv_heads, head_dim, dtype=q.dtype, device=q.device)
        keys[:ctx] = k_buffer[locs[ctx_offset : ctx_offset + ctx].long()]
        # [Hkv, packed columns, S*D]
        keys = keys.view(num_cols * per_block, stride, num_kv_heads, head_dim).permute(2, 0, 1, 3).flatten(2)
        queries = torch.zeros(num_rows * bsz, num_qo_heads, head_dim, dtype=q.dtype, device=q.device)
        start = prefix - first_block * bsz
        queries[start : start + extend] = q[q_offset : q_offset + extend]
        # [Hq, packed rows, S*D], each packed row's positions reversed: its dot with a packed column
        # sums the tile's antidiagonal
        queries = queries.view(num_rows * per_block, stride, num_qo_heads, head_dim).flip(1)
        queries = queries.permute(2, 0, 1, 3).flatten(2)
        step = max(1, SCORE_BYTES // (4 * num_qo_heads * num_cols * per_block * per_block)) * per_block
        for r0 in range(0, num_rows * per_block, step):
            r1 = min(r0 + step, num_rows * per_block)
            packed = torch.arange(r0, r1, device=q.device) + first_block * per_block  # absolute packed row
            s = torch.matmul(
                queries[:, r0:r1].reshape(num_kv_heads, group * (r1 - r0), -1), keys.transpose(1, 2)
            ).view(num_qo_heads, r1 - r0, -1)
            s = s.float() * (sm_scale / stride)
            cols = torch.arange(s.shape[-1], device=q.device)
            s.masked_fill_(cols[None, None, :] > packed[None, :, None], float("-inf"))
            p = s.softmax(-1)
            has_query = ((packed + 1) * stride > prefix) & (packed * stride < ctx)
            p.mul_(has_query[None, :, None])
            tiles = p.view(num_qo_heads, (r1 - r0) // per_block, per_block, num_cols, per_block).sum((2, 4))
            rows = first_row + r0 // per_block
            out[:, rows : rows + tiles.shape[1], :num_cols] = tiles
        first_row += num_rows
        q_offset += extend
        ctx_offset += ctx
    out /= out.sum(-1, keepdim=True).clamp_min(1e-30)
    if per_query_head:
        return out
    return out.view(num_kv_heads, group, layout.num_rows, layout.max_key_blocks).mean(1)
