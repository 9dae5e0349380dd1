"""Query tiles against per-block summaries: every query of a row block, every query head, scored
against one vector per key block of its request (block means), a few row blocks at a time (torch).

The torch side of the mean correction's mean tokens (its Triton kernel computes the same scores).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from .layout import BlockLayout

_STEP_ELEMENTS = 1 << 26  # scores held per step


def visible_blocks(layout: BlockLayout, device: torch.device) -> torch.Tensor:
    """Key blocks each row block sees in full (before its diagonal): bool [R, C]."""
    cols = torch.arange(layout.max_key_blocks, device=device)[None, :]
    return cols < layout.row_block.long().to(device)[:, None]


@dataclasses.dataclass(frozen=True)
class TileScores:
    """Scores of row blocks `rows` [Rg]: s [Rg, Hkv, G, B, C] = sm_scale * q . summary of key block c
    (padding rows and columns past a request's key blocks hold garbage: mask them), the query token of
    each (row, slot) `tokens` [Rg, B] and which slots are real queries `live` [Rg, B]; `keys` [Rg, C]
    indexes the flat key-block list (clamped)."""

    rows: torch.Tensor
    s: torch.Tensor
    tokens: torch.Tensor
    live: torch.Tensor
    keys: torch.Tensor


def tile_scores(
    q: torch.Tensor, summaries: torch.Tensor, layout: BlockLayout, sm_scale: float
) -> Iterator[TileScores]:
    """q [N, Hq, D] against summaries [K, Hkv, D] (fp32), row blocks in order, a bounded number per step."""
    num_qo_heads, head_dim = q.shape[1:]
    num_kv_heads = summaries.shape[1]
    num_cols, block = layout.max_key_blocks, layout.block_size
    device = q.device
    cols = torch.arange(num_cols, device=device)
    within = torch.arange(block, device=device)
    step = max(1, _STEP_ELEMENTS // (block * num_qo_heads * num_cols))
    for r0 in range(0, layout.num_rows, step):
        rows = torch.arange(r0, min(r0 + step, layout.num_rows), device=device)
        live = within[None, :] < layout.row_q_len[rows].long()[:, None]
        tokens = torch.where(live, layout.row_q_start[rows].long()[:, None] + within, 0)
        keys = layout.req_key_offset[layout.row_req[rows].long()].long()[:, None] + cols
        keys = keys.clamp(max=summaries.shape[0] - 1)
        qg = q[tokens].float().view(len(rows), block, num_kv_heads, -1, head_dim)
        s = torch.einsum("rbhgd,rchd->rhgbc", qg * sm_scale, summaries[keys])
        yield TileScores(rows, s, tokens, live, keys)
