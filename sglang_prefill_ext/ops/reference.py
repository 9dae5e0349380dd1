"""Exact fp32 block-sparse attention in torch, a chunk of query rows at a time (never L x L).

The reference the fp32 emulation of `bench/sparse_accuracy.py` runs every layer through (dense ones
too, `keep=None`) and the GPU tests compare FlashInfer's path against. One prompt, no cached prefix:
query i and key i are both position i, and blocks are `block_size` positions from 0.
"""

from __future__ import annotations

import torch


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    keep: torch.Tensor | None = None,
    block_size: int = 128,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of q [L, Hq, D] over k, v [L, Hkv, D] restricted to the key blocks `keep`
    [Hkv, R, C] keeps (None: every causal key). Returns out [L, Hq, D] and the natural log-sum-exp of
    the scaled scores [L, Hq], both fp32. Peak memory ~ Hq x `chunk` x L floats."""
    length, num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_qo_heads // num_kv_heads
    keys = k.float().transpose(0, 1)[:, None]  # [Hkv, 1, L, D]
    values = v.float().transpose(0, 1)[:, None]
    pos = torch.arange(length, device=q.device)
    out = torch.empty(length, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(length, num_qo_heads, dtype=torch.float32, device=q.device)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        rows = q[start:end].float().view(end - start, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        s = torch.matmul(rows * sm_scale, keys[:, :, :end].transpose(-1, -2))  # [Hkv, G, n, end]
        allowed = (pos[None, :end] <= pos[start:end, None])[None]  # [1, n, end]
        if keep is not None:
            allowed = allowed & keep[:, pos[start:end] // block_size][:, :, pos[:end] // block_size]
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        chunk_lse = torch.logsumexp(s, -1)
        o = torch.matmul(torch.exp(s - chunk_lse[..., None]), values[:, :, :end])  # [Hkv, G, n, D]
        out[start:end] = o.permute(2, 0, 1, 3).reshape(end - start, num_qo_heads, head_dim)
        lse[start:end] = chunk_lse.permute(2, 0, 1).reshape(end - start, num_qo_heads)
    return out, lse
