"""Block energy scorer (FlashPrefill, arXiv 2603.06199, as its V2 code selects).

For the query tile of row block r and KV head h (every query of the block, every query head of h's
group) and each key block c the tile sees in full (c before the diagonal), s = sm_scale * q . mean(k_c)
per query and head; the block's energy is E[h, r, c] = sum over the tile of exp(s - M), M the
tile's largest such score, i.e. the softmax weight the tile would give the block's mean key, summed.
A block is kept when E >= alpha x the row's largest E, or a structural rule holds (sinks, local
window, diagonal, last rows). Torch reference: ~1/block_size of a dense QK^T.
"""

from __future__ import annotations

import torch

from .layout import BlockLayout
from .scoring import structural_blocks
from .settings import SparseSettings
from .tiles import tile_scores


def _visible(layout: BlockLayout, device: torch.device) -> torch.Tensor:
    """Key blocks each row block sees in full (before its diagonal): bool [R, C]."""
    cols = torch.arange(layout.max_key_blocks, device=device)[None, :]
    return cols < layout.row_block.long().to(device)[:, None]


def block_energy(q: torch.Tensor, k_mean: torch.Tensor, layout: BlockLayout, sm_scale: float) -> torch.Tensor:
    """E [Hkv, R, C] fp32 from queries [N, Hq, D] and block mean keys [K, Hkv, D]; 0 where not visible."""
    visible = _visible(layout, q.device)
    energy = torch.zeros(k_mean.shape[1], layout.num_rows, layout.max_key_blocks, device=q.device)
    for t in tile_scores(q, k_mean, layout, sm_scale):
        scored = visible[t.rows][:, None, None, None, :] & t.live[:, None, None, :, None]
        s = t.s.masked_fill(~scored, float("-inf"))
        tile_max = s.amax((2, 3, 4), keepdim=True)
        energy[:, t.rows] = torch.exp(s - tile_max).nan_to_num(0.0).sum((2, 3)).transpose(0, 1)
    return energy


def select_by_energy(energy: torch.Tensor, layout: BlockLayout, settings: SparseSettings) -> torch.Tensor:
    """Kept blocks bool [Hkv, R, C]: energy >= `settings.alpha` x the row's best, plus the structural ones."""
    chosen = (energy >= settings.alpha * energy.amax(-1, keepdim=True)) & _visible(layout, energy.device)[
        None
    ]
    return chosen | structural_blocks(layout, settings, energy.device)[None]
