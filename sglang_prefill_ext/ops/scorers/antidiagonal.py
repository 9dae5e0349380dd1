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
query blocks and its keys to whole key blocks, and packed rows holding no query are left out. Both are
packed by one gather each, through row indices made once per forward (`Packing`). The packed product,
over the causal columns of each step of rows, is written once (bf16 on the GPU) and read once, by
`block_lse`: each packed row's log-sum-exp over each key block's packed columns, scaled in fp32, causal
(a packed column after the packed row is masked). `tile_mass` softmaxes those per packed row and sums
them per query block, in one kernel.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..dispatch import FLOOR, triton_enabled
from ..layout import BlockLayout

SCORE_BYTES = 1 << 29  # packed scores held at once per request (rows are processed in steps)


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """One step's rows of the scoring matmul: per KV head, `count` packed rows from absolute packed row
    `first`, each once per query head of the group (ordered KV head, packed row, group member), of a
    request whose queries sit at positions [prefix, ctx), `stride` positions per packed row."""

    first: int
    count: int
    group: int
    prefix: int
    ctx: int
    stride: int

    def positions(self, num_rows: int, device: torch.device | str) -> torch.Tensor:
        """Each row's absolute packed position, -1 for a packed row holding no query: [num_rows] int32."""
        packed = self.first + (torch.arange(num_rows, device=device) // self.group) % self.count
        live = ((packed + 1) * self.stride > self.prefix) & (packed * self.stride < self.ctx)
        return torch.where(live, packed, -1).to(torch.int32)


@triton.jit
def _packed_block_lse_kernel(
    s_ptr,
    out_ptr,
    num_rows,
    num_blocks,
    first,
    count,
    group,
    prefix,
    ctx,
    stride,
    scale,
    P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    blocks = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_live = rows < num_rows
    packed = first + (rows // group) % count
    has_query = ((packed + 1) * stride > prefix) & (packed * stride < ctx)
    pos = tl.where(row_live & has_query, packed, -1)
    cols = blocks[None, :, None] * P + tl.arange(0, P)[None, None, :]  # [1, BLOCK_C, P]
    live = row_live[:, None, None] & (blocks < num_blocks)[None, :, None]
    s = tl.load(s_ptr + rows.to(tl.int64)[:, None, None] * (num_blocks * P) + cols, mask=live, other=0.0)
    s = tl.where(live & (cols <= pos[:, None, None]), s.to(tl.float32) * scale, float("-inf"))
    block_max = tl.max(s, axis=2)
    safe_max = tl.where(block_max == float("-inf"), 0.0, block_max)
    block_sum = tl.sum(tl.exp(s - safe_max[:, :, None]), axis=2)
    lse = tl.where(block_sum > 0, safe_max + tl.log(tl.maximum(block_sum, 1e-30)), float("-inf"))
    out = rows.to(tl.int64)[:, None] * num_blocks + blocks[None, :]
    tl.store(out_ptr + out, lse, mask=row_live[:, None] & (blocks < num_blocks)[None, :])


def block_lse_triton(s: torch.Tensor, rows: PackedRows, per_block: int, scale: float) -> torch.Tensor:
    num_rows, num_cols = s.shape
    num_blocks = num_cols // per_block
    out = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=s.device)
    block_c = max(1, 256 // per_block)
    grid = (triton.cdiv(num_rows, 32), triton.cdiv(num_blocks, block_c))
    _packed_block_lse_kernel[grid](
        s,
        out,
        num_rows,
        num_blocks,
        rows.first,
        rows.count,
        rows.group,
        rows.prefix,
        rows.ctx,
        rows.stride,
        scale,
        P=per_block,
        BLOCK_R=32,
        BLOCK_C=block_c,
        num_warps=4,
    )
    return out


def block_lse_torch(s: torch.Tensor, rows: PackedRows, per_block: int, scale: float) -> torch.Tensor:
    num_rows, num_cols = s.shape
    row_pos = rows.positions(num_rows, s.device)
    cols = torch.arange(num_cols, device=s.device)
    s = (s.float() * scale).masked_fill(cols[None, :] > row_pos[:, None], float("-inf"))
    return s.view(num_rows, num_cols // per_block, per_block).logsumexp(-1)


def block_lse(s: torch.Tensor, rows: PackedRows, per_block: int, scale: float) -> torch.Tensor:
    """Packed scores s [N, C * per_block] (contiguous) of `rows`, times `scale`: log-sum-exp per key block
    over the packed columns up to the row's own, [N, C] fp32 (-inf where none is visible)."""
    impl = block_lse_triton if triton_enabled(s) else block_lse_torch
    return impl(s, rows, per_block, scale)


@triton.jit
def _gather_rows_kernel(
    src_ptr, idx_ptr, out_ptr, num_out, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = n < num_out
    src = tl.load(idx_ptr + n, mask=live, other=-1).to(tl.int64)
    d = tl.arange(0, D_PAD)
    x = tl.load(
        src_ptr + src[:, None] * D + d[None, :], mask=(src >= 0)[:, None] & (d < D)[None, :], other=0.0
    )
    tl.store(out_ptr + n.to(tl.int64)[:, None] * D + d[None, :], x, mask=live[:, None] & (d < D)[None, :])


def gather_rows_triton(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    out = torch.empty(index.numel(), src.shape[1], dtype=src.dtype, device=src.device)
    block_n = 64
    _gather_rows_kernel[(triton.cdiv(index.numel(), block_n),)](
        src,
        index,
        out,
        index.numel(),
        D=src.shape[1],
        D_PAD=triton.next_power_of_2(src.shape[1]),
        BLOCK_N=block_n,
    )
    return out


def gather_rows_torch(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.where((index >= 0)[:, None], src[index.clamp_min(0)], 0)


def gather_rows(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """src [N, D] (contiguous) rows `index` [M] (-1: a zero row): [M, D], one pass."""
    impl = gather_rows_triton if triton_enabled(src) else gather_rows_torch
    return impl(src, index)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Per request of a layout, which rows of q [N * Hq, D] and of the KV pool's keys [T * Hkv, D] make its
    packed queries [Hkv, packed rows, G, S * D] (each packed row's S positions reversed, positions without a
    query zero) and packed keys [Hkv, key blocks * B / S, S * D] (zero past the context): -1 is a zero row.
    It depends on the layout, the KV slots and the head counts, not on the layer: built once per forward."""

    query_rows: tuple[torch.Tensor, ...]
    key_rows: tuple[torch.Tensor, ...]

    @classmethod
    def build(
        cls, layout: BlockLayout, locs: torch.Tensor, num_qo_heads: int, num_kv_heads: int, stride: int
    ) -> Packing:
        bsz, group, device = layout.block_size, num_qo_heads // num_kv_heads, locs.device
        heads = torch.arange(num_qo_heads, device=device).view(num_kv_heads, 1, group, 1)
        kv_heads = torch.arange(num_kv_heads, device=device)[:, None]
        query_rows, key_rows = [], []
        q_offset = ctx_offset = 0
        for prefix, extend in zip(layout.prefix_lens, layout.extend_lens, strict=True):
            ctx = prefix + extend
            num_cols = (ctx - 1) // bsz + 1
            first = prefix // bsz * bsz
            pos = first + torch.arange((num_cols * bsz - first), device=device).view(-1, stride).flip(1)
            tok = (q_offset + pos - prefix)[None, :, None, :] * num_qo_heads + heads
            query_rows.append(
                torch.where(((pos >= prefix) & (pos < ctx))[None, :, None, :], tok, -1).flatten()
            )
            key_pos = torch.arange(num_cols * bsz, device=device)
            slots = locs[ctx_offset + key_pos.clamp(max=ctx - 1)].long()
            key_rows.append(torch.where(key_pos < ctx, slots * num_kv_heads + kv_heads, -1).flatten())
            q_offset += extend
            ctx_offset += ctx
        return cls(tuple(query_rows), tuple(key_rows))


@triton.jit
def _tile_mass_kernel(
    lse_ptr,
    out_ptr,
    packed_rows,
    num_cols,
    group,
    out_head_stride,
    out_row0,
    max_cols,
    P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One (query head, query block): its P packed rows' block lse -> softmax per row -> summed over the
    rows, normalised (mean over the rows holding a query). Two passes: online row lse, then the mass."""
    head = tl.program_id(0)
    qb = tl.program_id(1)
    kv_head = head // group
    rows = ((kv_head * packed_rows + qb * P + tl.arange(0, P)) * group + head % group).to(tl.int64)
    row_max = tl.full([P], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([P], dtype=tl.float32)
    for c0 in range(0, num_cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(
            lse_ptr + rows[:, None] * num_cols + c[None, :], mask=c[None, :] < num_cols, other=float("-inf")
        )
        new_max = tl.maximum(row_max, tl.max(x, 1))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - safe) + tl.sum(tl.exp(x - safe[:, None]), 1)
        row_max = new_max
    live = row_sum > 0
    row_lse = tl.where(
        live, tl.where(live, row_max, 0.0) + tl.log(tl.where(live, row_sum, 1.0)), float("inf")
    )
    scale = 1.0 / tl.maximum(tl.sum(live.to(tl.float32), 0), 1.0)
    out_row = out_ptr + head.to(tl.int64) * out_head_stride + (out_row0 + qb).to(tl.int64) * max_cols
    for c0 in range(0, num_cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(
            lse_ptr + rows[:, None] * num_cols + c[None, :], mask=c[None, :] < num_cols, other=float("-inf")
        )
        tl.store(out_row + c, tl.sum(tl.exp(x - row_lse[:, None]), 0) * scale, mask=c < num_cols)


def tile_mass_triton(
    lse: torch.Tensor, out: torch.Tensor, group: int, per_block: int, first_row: int
) -> None:
    num_cols = lse.shape[1]
    num_qo_heads = out.shape[0]
    packed_rows = lse.shape[0] // num_qo_heads
    _tile_mass_kernel[(num_qo_heads, packed_rows // per_block)](
        lse,
        out,
        packed_rows,
        num_cols,
        group,
        out.stride(0),
        first_row,
        out.shape[2],
        P=per_block,
        BLOCK_C=min(triton.next_power_of_2(num_cols), 4096 // per_block),
        num_warps=4,
    )


def tile_mass_torch(lse: torch.Tensor, out: torch.Tensor, group: int, per_block: int, first_row: int) -> None:
    num_qo_heads, num_cols = out.shape[0], lse.shape[1]
    m = lse.shape[0] // num_qo_heads
    lse = (
        lse.view(num_qo_heads // group, m, group, num_cols).transpose(1, 2).reshape(num_qo_heads, m, num_cols)
    )
    p = torch.exp(lse - lse.logsumexp(-1, keepdim=True).clamp_min(FLOOR))
    tiles = p.view(num_qo_heads, m // per_block, per_block, num_cols).sum(2)
    tiles /= tiles.sum(-1, keepdim=True).clamp_min(1e-30)
    out[:, first_row : first_row + tiles.shape[1], :num_cols] = tiles


def tile_mass(lse: torch.Tensor, out: torch.Tensor, group: int, per_block: int, first_row: int) -> None:
    """Packed rows' block lse [Hkv * m * G, C] (rows ordered KV head, packed row, group member; m a multiple
    of `per_block`, -inf where nothing is visible) -> each query block's mass over key blocks, summing to 1,
    written to out[Hq, first_row + m / per_block rows, :C]."""
    impl = tile_mass_triton if triton_enabled(lse) else tile_mass_torch
    impl(lse.contiguous(), out, group, per_block, first_row)


def antidiagonal_mass(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    stride: int,
    sm_scale: float,
    per_query_head: bool = False,
    packing: Packing | None = None,
) -> torch.Tensor:
    """q [N, Hq, D] (the batch's extend rows), keys read from the pool k_buffer [T, Hkv, D] through
    `locs` (every context position, request after request; `packing`: the forward's `Packing` of them, made
    here if None): mass [Hq or Hkv, R, max_key_blocks] fp32."""
    num_qo_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    group = num_qo_heads // num_kv_heads
    bsz = layout.block_size
    assert bsz % stride == 0, "stride must divide the block size"
    per_block = bsz // stride  # packed rows (and columns) per block
    if packing is None:
        packing = Packing.build(layout, locs, num_qo_heads, num_kv_heads, stride)
    q_rows, k_rows = q.reshape(-1, head_dim), k_buffer.view(-1, head_dim)
    out = torch.zeros(
        num_qo_heads, layout.num_rows, layout.max_key_blocks, dtype=torch.float32, device=q.device
    )
    first_row = 0
    for b, (prefix, extend) in enumerate(zip(layout.prefix_lens, layout.extend_lens, strict=True)):
        ctx = prefix + extend
        num_cols = (ctx - 1) // bsz + 1
        first_block = prefix // bsz
        packed_rows = (num_cols - first_block) * per_block
        keys = gather_rows(k_rows, packing.key_rows[b]).view(num_kv_heads, num_cols * per_block, -1)
        queries = gather_rows(q_rows, packing.query_rows[b]).view(num_kv_heads, packed_rows * group, -1)
        row_bytes = num_qo_heads * num_cols * per_block * q.element_size()  # one packed row's scores
        step = max(1, SCORE_BYTES // (row_bytes * per_block)) * per_block
        for r0 in range(0, packed_rows, step):
            r1 = min(r0 + step, packed_rows)
            cols = first_block + r1 // per_block  # key blocks up to the step's last diagonal: causal
            s = torch.matmul(queries[:, r0 * group : r1 * group], keys[:, : cols * per_block].transpose(1, 2))
            rows = PackedRows(first_block * per_block + r0, r1 - r0, group, prefix, ctx, stride)
            lse = block_lse(s.view(-1, cols * per_block), rows, per_block, sm_scale / stride)
            tile_mass(lse, out, group, per_block, first_row + r0 // per_block)
        first_row += packed_rows // per_block
    if per_query_head:
        return out
    return out.view(num_kv_heads, group, layout.num_rows, layout.max_key_blocks).mean(1)
