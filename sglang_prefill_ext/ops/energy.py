"""Block energy scorers (FlashPrefill, arXiv 2603.06199, and its V2).

A tile is the queries of row block r with one query head (scorer "head-energy", FlashPrefill) or
with every query head of a KV head's group packed together (scorer "energy", V2's PackGQA). For each
key block c the tile sees in full (c before the diagonal), s = sm_scale * q . mean(k_c) per packed
row; the block's energy is E = sum over the tile of exp(s - M), M the tile's largest such score: the
softmax weight the tile gives the block's mean key, summed. A KV head keeps a block when, for one of
its tiles, E >= alpha x that tile's largest E, or a structural rule holds (sinks, local window,
diagonal, last rows). Cost ~2/block_size of a dense QK^T: the Triton kernel takes one (row block,
tile) per program, in two passes over the block means (the tile's max, then the energies); the
torch reference holds a few row blocks' scores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import triton_enabled
from .layout import BlockLayout
from .scoring import structural_blocks
from .settings import SparseSettings
from .tiles import packed_tile_scores, tile_scores, visible_blocks


@triton.jit
def _energy_kernel(
    q_ptr,
    kmean_ptr,
    row_req_ptr,
    row_block_ptr,
    row_q_start_ptr,
    row_q_len_ptr,
    key_offset_ptr,
    out_ptr,
    num_rows,
    max_cols,
    num_qo_heads,
    num_kv_heads,
    group,
    tile_heads,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    tile = tl.program_id(1)
    first_head = tile * tile_heads
    kv_head = first_head // group
    diag = tl.load(row_block_ptr + row)
    q_start = tl.load(row_q_start_ptr + row)
    num_packed = tl.load(row_q_len_ptr + row) * tile_heads
    key_offset = tl.load(key_offset_ptr + tl.load(row_req_ptr + row))
    tile_max = tl.full((), float("-inf"), tl.float32)
    for c0 in range(0, diag, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        for p0 in range(0, num_packed, BLOCK_M):
            packed = p0 + tl.arange(0, BLOCK_M)
            s = packed_tile_scores(
                q_ptr,
                kmean_ptr,
                q_start,
                packed,
                num_packed,
                cols,
                diag,
                key_offset,
                first_head,
                tile_heads,
                kv_head,
                num_qo_heads,
                num_kv_heads,
                sm_scale,
                HEAD_DIM,
            )
            tile_max = tl.maximum(tile_max, tl.max(s))
    out_row = out_ptr + (tile.to(tl.int64) * num_rows + row) * max_cols
    for c0 in range(0, diag, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        energy = tl.zeros([BLOCK_C], dtype=tl.float32)
        for p0 in range(0, num_packed, BLOCK_M):
            packed = p0 + tl.arange(0, BLOCK_M)
            s = packed_tile_scores(
                q_ptr,
                kmean_ptr,
                q_start,
                packed,
                num_packed,
                cols,
                diag,
                key_offset,
                first_head,
                tile_heads,
                kv_head,
                num_qo_heads,
                num_kv_heads,
                sm_scale,
                HEAD_DIM,
            )
            energy += tl.sum(tl.exp(s - tile_max), axis=0)
        tl.store(out_row + cols, energy, mask=cols < diag)


def block_energy_triton(
    q: torch.Tensor,
    k_mean: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
    tile_heads: int,
    block_rows: int = 64,
    block_cols: int = 32,
) -> torch.Tensor:
    """`block_rows` packed rows and `block_cols` key blocks per inner step (launch tuning only)."""
    num_qo_heads, head_dim = q.shape[1:]
    num_kv_heads = k_mean.shape[1]
    num_tiles = num_qo_heads // tile_heads
    out = torch.zeros(num_tiles, layout.num_rows, layout.max_key_blocks, dtype=torch.float32, device=q.device)
    if layout.num_rows == 0:
        return out
    _energy_kernel[(layout.num_rows, num_tiles)](
        q.contiguous(),
        k_mean.contiguous(),
        layout.row_req,
        layout.row_block,
        layout.row_q_start,
        layout.row_q_len,
        layout.req_key_offset,
        out,
        layout.num_rows,
        layout.max_key_blocks,
        num_qo_heads,
        num_kv_heads,
        num_qo_heads // num_kv_heads,
        tile_heads,
        sm_scale,
        HEAD_DIM=head_dim,
        BLOCK_M=block_rows,
        BLOCK_C=block_cols,
    )
    return out


def block_energy_reference(
    q: torch.Tensor, k_mean: torch.Tensor, layout: BlockLayout, sm_scale: float, tile_heads: int
) -> torch.Tensor:
    num_tiles = q.shape[1] // tile_heads
    visible = visible_blocks(layout, q.device)
    energy = torch.zeros(num_tiles, layout.num_rows, layout.max_key_blocks, device=q.device)
    for t in tile_scores(q, k_mean, layout, sm_scale):
        scored = visible[t.rows][:, None, None, None, :] & t.live[:, None, None, :, None]
        s = t.s.flatten(1, 2).unflatten(1, (num_tiles, tile_heads))  # [Rg, tiles, heads, B, C]
        s = s.masked_fill(~scored, float("-inf"))
        tile_max = s.amax((2, 3, 4), keepdim=True)
        energy[:, t.rows] = torch.exp(s - tile_max).nan_to_num(0.0).sum((2, 3)).transpose(0, 1)
    return energy


def block_energy(
    q: torch.Tensor, k_mean: torch.Tensor, layout: BlockLayout, sm_scale: float, tile_heads: int
) -> torch.Tensor:
    """E [Hq / tile_heads, R, C] fp32 from queries [N, Hq, D] and block mean keys [K, Hkv, D], tiles of
    `tile_heads` consecutive query heads (1, or the group size); 0 where not visible."""
    impl = block_energy_triton if triton_enabled(q) else block_energy_reference
    return impl(q, k_mean, layout, sm_scale, tile_heads)


def select_by_energy(
    energy: torch.Tensor, num_kv_heads: int, layout: BlockLayout, settings: SparseSettings
) -> torch.Tensor:
    """Kept blocks bool [Hkv, R, C] from the tiles' energies [tiles, R, C] (see the module's docstring)."""
    passed = energy >= settings.alpha * energy.amax(-1, keepdim=True)
    chosen = passed.unflatten(0, (num_kv_heads, -1)).any(1) & visible_blocks(layout, energy.device)[None]
    return chosen | structural_blocks(layout, settings, energy.device)[None]
