"""The guard: how much of their exact attention sampled query rows find in a layer's kept blocks.

For the rows `scorers/sampled.py` samples (`samples` per query block: its last, then evenly back to its first),
every query head's exact softmax over all its causal keys (`row_mass`) is summed over the key blocks
the layer's selection keeps for that head (its own blocks per query head, else its KV head's): the
kept share of the row, 1 when nothing it attends to was dropped. The layer's statistic is the
`GUARD_QUANTILE` low quantile of the kept shares over every (query head, sampled row).

Why a low quantile: what sparse prefill loses is a few rows that needed a dropped block (a retrieval
head's row reading one needle), not the typical row, which holds about the selection's own mass
fraction by construction; a mean over rows hides those few, the minimum over thousands of rows is one
outlier's. The 1 % quantile (`GUARD_QUANTILE`) is the share that all but 1 in 100 (head, row) pairs reach: it falls when
a tail of rows loses attention, and still rests on tens of rows at the shortest sparse prompt (32K
tokens: 256 query blocks x samples x query heads).
"""

from __future__ import annotations

import torch

from .settings import GUARD_QUANTILE


def kept_share(mass: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The share of each sampled row's attention `mass` [Hkv, R, C, samples, group] (`row_mass`, which
    this overwrites) in the blocks `keep` [Hkv or Hq, R, C] keeps: fp32 [Hkv, R, samples, group]."""
    num_kv_heads, num_rows, num_cols, _, group = mass.shape
    per_head = keep.reshape(num_kv_heads, -1, num_rows, num_cols).permute(0, 2, 3, 1)  # [Hkv, R, C, 1 or G]
    return mass.masked_fill_(~per_head[:, :, :, None, :], 0.0).sum(2)


def low_quantile(share: torch.Tensor) -> float:
    """The `GUARD_QUANTILE` quantile of `share` (the lower of the two nearest values; 1.0 when empty),
    read back to the host."""
    flat = share.flatten()
    if flat.numel() == 0:
        return 1.0
    return float(flat.kthvalue(1 + int(GUARD_QUANTILE * (flat.numel() - 1))).values)
