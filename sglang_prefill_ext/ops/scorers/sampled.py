"""Block attention mass from sampled query rows: what a query block actually reads, at a fraction of the cost.

For every query block (row) a few query positions are sampled (`samples`: the last row of the block,
then evenly spread back to its first); each sampled row of every query head of a KV head's group
attends exactly, with softmax over all its causal keys, and its weight is summed per key block. The
mass of key block c for row r and KV head h is the mean of those sums over the group's heads and
the samples: mass[h, r, c] in [0, 1], each row summing to 1. Pooled means (pooled.py) average a
spiky key away; exact rows of real queries do not, and cost samples x group / block_size of dense
QK^T (no PV). Keys are read from the KV pool through `locs`, so a cached prefix costs no extra pass.

The kernel takes up to `ROW_BLOCKS` consecutive rows of one request and `CHUNK_COLS` key blocks
per program, so each key tile read from the pool serves all those rows and long rows spread over
many programs; it writes every sampled row's log-sum-exp per key block. Normalising over the key
blocks and averaging over the samples and heads is then a few torch ops; `row_mass` stops before the
mean, each sampled row of each query head on its own (what the guard, ../guard.py, reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from ..dispatch import FLOOR, triton_enabled
from ..layout import BlockLayout

_FLOOR = tl.constexpr(FLOOR)
_LN2 = tl.constexpr(0.6931471805599453)
_LOG2E = 1.4426950408889634


def sample_offsets(layout: BlockLayout, samples: int) -> torch.Tensor:
    """Offset of each sampled query inside its row block, [R, samples] int32: the last query first,
    then evenly back to the first (repeats when a row block holds fewer queries than samples)."""
    length = layout.row_q_len.long()[:, None]
    s = torch.arange(samples, device=length.device)[None, :]
    back = (s * (length - 1)) // max(samples - 1, 1)
    return (length - 1 - back).to(torch.int32)


@dataclasses.dataclass(frozen=True)
class SampleGeometry:
    """What the kernel needs besides Q/K, fixed for one layout: sampled offsets [R, samples], the first
    row of every tile, rows per tile and padded slots (sampled rows x group heads) per row block."""

    offsets: torch.Tensor
    tiles: torch.Tensor
    row_blocks: int
    slots: int


def sample_geometry(layout: BlockLayout, samples: int, group: int, tile_rows: int = 128) -> SampleGeometry:
    """Built once per layout and shared by every layer (`tile_rows`: sampled rows per program)."""
    slots = triton.next_power_of_2(samples * group)
    row_blocks = max(tile_rows // slots, 16 // slots, 1)
    offsets = sample_offsets(layout, samples).contiguous()
    return SampleGeometry(offsets, row_tiles(layout, row_blocks), row_blocks, slots)


def row_tiles(layout: BlockLayout, row_blocks: int) -> torch.Tensor:
    """First row of every tile of up to `row_blocks` consecutive rows of one request, [T] int32."""
    req = layout.row_req.long()
    rows = torch.arange(req.numel(), device=req.device)
    first = torch.ones_like(req, dtype=torch.bool)
    first[1:] = req[1:] != req[:-1]
    req_first_row = torch.cummax(torch.where(first, rows, 0), 0).values
    starts = ((rows - req_first_row) % row_blocks) == 0
    return rows[starts].to(torch.int32)


@triton.jit
def _tile_scores(q, k_ptr, locs_ptr, tok_start, live, cols, head, num_kv_heads, HEAD_DIM: tl.constexpr):
    slots = tl.load(locs_ptr + tok_start + cols, mask=live, other=0)
    dims = tl.arange(0, HEAD_DIM)
    k = tl.load(
        k_ptr + (slots[:, None] * num_kv_heads + head) * HEAD_DIM + dims[None, :],
        mask=live[:, None],
        other=0.0,
    )
    return tl.dot(q, tl.trans(k.to(q.dtype)))


@triton.jit
def _store_block_lse(ptrs, block_max, weights, live):
    """Store each row's natural-log sum of exp over the block (base-2 max and weights), or the floor
    for a row that sees none of it."""
    block_sum = tl.sum(weights, axis=1)
    block_lse = (block_max + tl.log2(tl.maximum(block_sum, 1e-30))) * _LN2
    tl.store(ptrs, tl.where(block_sum > 0, block_lse, _FLOOR), mask=live)


@triton.jit
def _sampled_block_lse_kernel(
    q_ptr,
    k_ptr,
    locs_ptr,
    tile_ptr,
    row_req_ptr,
    row_block_ptr,
    row_q_start_ptr,
    row_q_len_ptr,
    offsets_ptr,
    key_offset_ptr,
    key_tok_start_ptr,
    key_len_ptr,
    lse_ptr,
    num_rows,
    max_cols,
    stride_q_row,
    stride_q_head,
    num_kv_heads,
    group,
    samples,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    SLOTS: tl.constexpr,
    ROW_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK_COLS: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    first = tl.load(tile_ptr + tile)
    req = tl.load(row_req_ptr + first)
    i = tl.arange(0, ROW_BLOCKS * SLOTS) // SLOTS  # row block within the tile
    j = tl.arange(0, ROW_BLOCKS * SLOTS) % SLOTS  # slot: sample j // group of query head j % group
    row = first + i
    row_live = row < num_rows
    row_live = row_live & (tl.load(row_req_ptr + row, mask=row_live, other=-1) == req)
    live = row_live & (j < samples * group)
    diag = tl.load(row_block_ptr + row, mask=row_live, other=-1)
    q_len = tl.load(row_q_len_ptr + row, mask=row_live, other=1)
    offset = tl.load(offsets_ptr + row * samples + j // group, mask=live, other=0)
    q_row = (tl.load(row_q_start_ptr + row, mask=row_live, other=0) + offset).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    q_head = head * group + j % group
    q = tl.load(
        q_ptr + q_row[:, None] * stride_q_row + q_head[:, None] * stride_q_head + dims[None, :],
        mask=live[:, None],
        other=0.0,
    )
    key_offset = tl.load(key_offset_ptr + req)
    diag_len = tl.load(key_len_ptr + key_offset + diag, mask=row_live, other=0)
    q_pos = diag_len - q_len + offset  # position of the sampled query inside its diagonal block
    cols = tl.arange(0, BLOCK)
    lse_row = (head * num_rows + row).to(tl.int64) * max_cols * SLOTS + j
    first_col = tl.program_id(2) * CHUNK_COLS
    c_end = tl.minimum(tl.max(tl.where(row_live, diag, 0), axis=0) + 1, first_col + CHUNK_COLS)
    # Key blocks before every row's diagonal are full and wholly visible: no masks (rows that are
    # padding hold q = 0 and are never stored).
    unmasked_end = tl.maximum(first_col, tl.minimum(c_end, tl.min(tl.where(row_live, diag, c_end), axis=0)))
    for c in range(first_col, unmasked_end):
        kb = key_offset + c
        s = _tile_scores(
            q, k_ptr, locs_ptr, tl.load(key_tok_start_ptr + kb), cols < BLOCK, cols, head, num_kv_heads, HEAD_DIM
        ) * scale_log2  # fmt: skip
        block_max = tl.max(s, axis=1)
        _store_block_lse(lse_ptr + lse_row + c * SLOTS, block_max, tl.exp2(s - block_max[:, None]), live)
    for c in range(unmasked_end, c_end):
        kb = key_offset + c
        key_live = cols < tl.load(key_len_ptr + kb)
        s = _tile_scores(
            q, k_ptr, locs_ptr, tl.load(key_tok_start_ptr + kb), key_live, cols, head, num_kv_heads, HEAD_DIM
        ) * scale_log2  # fmt: skip
        visible = (c < diag)[:, None] | ((c == diag)[:, None] & (cols[None, :] <= q_pos[:, None]))
        visible = visible & key_live[None, :] & live[:, None]
        s = tl.where(visible, s, _FLOOR)
        block_max = tl.max(s, axis=1)
        weights = tl.where(visible, tl.exp2(s - block_max[:, None]), 0.0)
        _store_block_lse(lse_ptr + lse_row + c * SLOTS, block_max, weights, live)


def row_mass_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
    geometry: SampleGeometry | None = None,
    tile_rows: int = 128,
    chunk_cols: int = 32,
    num_warps: int = 8,
) -> torch.Tensor:
    """`geometry` from `sample_geometry` (built here with `tile_rows` when not given); `chunk_cols`
    key blocks per program (launch tuning only)."""
    num_rows, num_cols = layout.num_rows, layout.max_key_blocks
    num_qo_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    group = num_qo_heads // num_kv_heads
    if geometry is None:
        geometry = sample_geometry(layout, samples, group, tile_rows)
    slots, tiles = geometry.slots, geometry.tiles
    if num_rows == 0:
        return torch.zeros(num_kv_heads, 0, num_cols, samples, group, dtype=torch.float32, device=q.device)
    assert k_buffer.is_contiguous() and q.stride(-1) == 1 and layout.block_size <= 256
    lse = torch.full(
        (num_kv_heads, num_rows, num_cols, slots), _FLOOR.value, dtype=torch.float32, device=q.device
    )
    _sampled_block_lse_kernel[(tiles.numel(), num_kv_heads, triton.cdiv(num_cols, chunk_cols))](
        q,
        k_buffer,
        locs.long().contiguous(),
        tiles,
        layout.row_req,
        layout.row_block,
        layout.row_q_start,
        layout.row_q_len,
        geometry.offsets,
        layout.req_key_offset,
        layout.key_tok_start,
        layout.key_len,
        lse,
        num_rows,
        num_cols,
        q.stride(0),
        q.stride(1),
        num_kv_heads,
        group,
        samples,
        sm_scale * _LOG2E,
        HEAD_DIM=head_dim,
        SLOTS=slots,
        ROW_BLOCKS=geometry.row_blocks,
        BLOCK=layout.block_size,
        CHUNK_COLS=chunk_cols,
        num_warps=num_warps,
    )
    lse = lse[..., : samples * group]
    mass = torch.exp(lse - lse.logsumexp(2, keepdim=True))
    return mass.view(num_kv_heads, num_rows, num_cols, samples, group)


def _averaged(mass: torch.Tensor, per_query_head: bool) -> torch.Tensor:
    """Row mass [Hkv, R, C, samples, group] averaged over the samples and, per KV head, the group:
    [Hkv, R, C], or [Hq, R, C] per query head (query head h * group + g)."""
    if not per_query_head:
        return mass.flatten(3).mean(3)
    num_kv_heads, num_rows, num_cols, _, group = mass.shape
    return mass.mean(3).permute(0, 3, 1, 2).reshape(num_kv_heads * group, num_rows, num_cols)


def block_mass_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
    geometry: SampleGeometry | None = None,
    per_query_head: bool = False,
    **launch: int,
) -> torch.Tensor:
    """`row_mass_triton`'s rows averaged (`launch`: its tile_rows, chunk_cols, num_warps)."""
    mass = row_mass_triton(q, k_buffer, locs, layout, samples, sm_scale, geometry, **launch)
    return _averaged(mass, per_query_head)


def _request_row_mass(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per request, its row blocks and their sampled rows' mass with dense torch softmax (float32):
    (rows [n], mass [Hkv, group, n, samples, its key blocks])."""
    num_kv_heads = k_buffer.shape[1]
    group = q.shape[1] // num_kv_heads
    bsz = layout.block_size
    offsets = sample_offsets(layout, samples).long()
    for b in range(layout.req_ctx_len.numel()):
        rows = (layout.row_req == b).nonzero().flatten()
        ctx_len = int(layout.req_ctx_len[b])
        start = int(layout.req_ctx_offset[b])
        keys = k_buffer[locs[start : start + ctx_len].long()].float()  # [Lctx, Hkv, D]
        keys = keys.repeat_interleave(group, 1).transpose(0, 1)  # [Hq, Lctx, D]
        q_rows = (layout.row_q_start.long()[rows, None] + offsets[rows]).flatten()
        last = torch.clamp((layout.row_block.long()[rows] + 1) * bsz, max=ctx_len) - 1
        pos = (last[:, None] - (layout.row_q_len.long()[rows, None] - 1 - offsets[rows])).flatten()
        s = torch.einsum("nhd,hkd->hnk", q[q_rows].float(), keys) * sm_scale
        s = s.masked_fill(
            torch.arange(ctx_len, device=q.device)[None, None, :] > pos[None, :, None], float("-inf")
        )
        p = s.softmax(-1)
        num_cols = (ctx_len - 1) // bsz + 1
        p = (
            torch.nn.functional.pad(p, (0, num_cols * bsz - ctx_len))
            .view(*p.shape[:2], num_cols, bsz)
            .sum(-1)
        )
        yield rows, p.view(num_kv_heads, group, rows.numel(), samples, num_cols)


def block_mass_torch(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
    per_query_head: bool = False,
) -> torch.Tensor:
    """`row_mass_torch`'s rows averaged."""
    return _averaged(row_mass_torch(q, k_buffer, locs, layout, samples, sm_scale), per_query_head)


def row_mass_torch(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
) -> torch.Tensor:
    """`row_mass` with dense torch softmax, one request at a time (float32)."""
    num_kv_heads = k_buffer.shape[1]
    group = q.shape[1] // num_kv_heads
    shape = (num_kv_heads, layout.num_rows, layout.max_key_blocks, samples, group)
    out = torch.zeros(shape, dtype=torch.float32, device=q.device)
    for rows, p in _request_row_mass(q, k_buffer, locs, layout, samples, sm_scale):
        out[:, rows, : p.shape[-1]] = p.permute(0, 2, 4, 3, 1)
    return out


def row_mass(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
    geometry: SampleGeometry | None = None,
) -> torch.Tensor:
    """Each sampled row's own exact attention per key block, before any mean: fp32 [Hkv, R,
    max_key_blocks, samples, group] (query head h * group + g of KV head h), each (row, sample, head)
    summing to 1 over its causal blocks; what the guard (ops/guard.py) measures kept blocks against."""
    if triton_enabled(q):
        return row_mass_triton(q, k_buffer, locs, layout, samples, sm_scale, geometry)
    return row_mass_torch(q, k_buffer, locs, layout, samples, sm_scale)


def block_mass(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    locs: torch.Tensor,
    layout: BlockLayout,
    samples: int,
    sm_scale: float,
    geometry: SampleGeometry | None = None,
    per_query_head: bool = False,
) -> torch.Tensor:
    """Estimated attention mass per (KV head, row block, key block), [Hkv, R, max_key_blocks] float32, or
    per query head ([Hq, R, C], the group's mean not taken); `geometry` (the Triton kernel's, see
    `sample_geometry`) saves rebuilding it per layer."""
    return _averaged(row_mass(q, k_buffer, locs, layout, samples, sm_scale, geometry), per_query_head)
