"""Blended attention: queries at any subset of a prompt's positions, causal over the whole prompt's KV.

Selective recompute (docs/BLEND.md) runs only some of a prompt's tokens through a layer: the question,
text outside every chunk and the chosen chunk tokens. Their queries sit at scattered positions, so the
bottom-right causal mask of a plain prefill kernel does not apply: query i sees key j when
j <= q_pos[i]. Keys `k`, `v` are the blended KV of all `[keys, kv_heads, head_dim]` positions, in
position order; query heads are grouped over KV heads as in GQA.

`blend_attention_fp32` is the reference (float32, an explicit softmax). `blend_attention` is the path
a server can take today: torch SDPA in the inputs' dtype with the position mask, a block of queries
at a time so no mask is larger than QUERY_BLOCK x keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QUERY_BLOCK = 1024


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q [queries, heads, d] and k, v [keys, kv_heads, d] expected, got "
            f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k.shape[1]} KV heads")
    if q_pos.shape != (q.shape[0],):
        raise ValueError(f"q_pos must be [{q.shape[0]}], got {list(q_pos.shape)}")


def _visible(q_pos: torch.Tensor, keys: int) -> torch.Tensor:
    """[queries, keys] bool: key j is visible to query i when j <= q_pos[i]."""
    return torch.arange(keys, device=q_pos.device)[None, :] <= q_pos[:, None]


def blend_attention_fp32(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, sm_scale: float
) -> torch.Tensor:
    """[queries, heads, d] in q's dtype, computed in float32."""
    _check(q, k, v, q_pos)
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * sm_scale
    scores = scores.masked_fill(~_visible(q_pos, k.shape[0]), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf).to(q.dtype)


def blend_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, sm_scale: float
) -> torch.Tensor:
    """[queries, heads, d] in q's dtype, through SDPA in that dtype."""
    _check(q, k, v, q_pos)
    group = q.shape[1] // k.shape[1]
    # [1, heads, tokens, d]: SDPA's fused kernels take 4-d inputs only (3-d ones run its math path)
    kh = k.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    vh = v.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    out = torch.empty_like(q)
    for start in range(0, q.shape[0], QUERY_BLOCK):
        rows = slice(start, start + QUERY_BLOCK)
        pos = q_pos[rows]
        seen = int(pos.max()) + 1  # keys past the block's last query position are masked for all of it
        out[rows] = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1)[None],
            kh[:, :, :seen],
            vh[:, :, :seen],
            attn_mask=_visible(pos, seen)[None, None],
            scale=sm_scale,
        )[0].transpose(0, 1)
    return out
