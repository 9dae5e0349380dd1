"""Mean correction of skipped key blocks (FlashPrefill V2, arXiv 2608.19758).

A key block that a query block skips although it sees it in full (strictly before its diagonal)
enters the softmax of that query block's rows as one token: the block's mean key and mean value,
its score raised by log(n), n the block's tokens. When the block's keys are all equal that token is
exactly the block's contribution (n equal weights times the mean value); otherwise it approximates
the skipped mass instead of dropping it. The kept blocks' attention (its output and log-sum-exp) and
the mean tokens' attention are merged exactly. Torch, any device; the mean-token attention costs
queries x key blocks, ~1/block_size of a dense QK^T.
"""

from __future__ import annotations

import math

import torch

from .layout import BlockLayout
from .pooling import key_segments, segment_mean
from .tiles import tile_scores

# FlashInfer's kernels return log2(sum 2^(score * log2 e)) (fa2 prefill.cuh and fa3 attention_updater.cuh)
FLASHINFER_LSE_TO_NATURAL = math.log(2.0)


def block_means(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, layout: BlockLayout, locs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean key and mean value of every key block, read from the KV pool: [K, Hkv, D] fp32 each."""
    segments = key_segments(layout, locs)
    return segment_mean(k_buffer, segments), segment_mean(v_buffer, segments)


def skipped_visible(mask: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Key blocks each row skips though it sees them in full (before its diagonal): bool [Hkv, R, C]."""
    cols = torch.arange(mask.shape[-1], device=mask.device)[None, :]
    return ~mask & (cols < layout.row_block.long().to(mask.device)[:, None])[None]


def mean_token_attention(
    q: torch.Tensor,
    k_mean: torch.Tensor,
    v_mean: torch.Tensor,
    skipped: torch.Tensor,
    layout: BlockLayout,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of every query q [N, Hq, D] over the mean tokens of its row's `skipped` blocks
    [Hkv, R, C] (score + log n). Returns out [N, Hq, D] and natural log-sum-exp [N, Hq], fp32; rows
    without a skipped block get out 0, lse -inf."""
    num_tokens, num_qo_heads, head_dim = q.shape
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_qo_heads), float("-inf"), dtype=torch.float32, device=q.device)
    if not skipped.any():
        return out, lse
    for t in tile_scores(q, k_mean, layout, sm_scale):
        s = t.s + layout.key_len[t.keys].float().log()[:, None, None, None, :]
        s = s.masked_fill(~skipped[:, t.rows].transpose(0, 1)[:, :, None, None, :], float("-inf"))
        step_lse = torch.logsumexp(s, -1)  # [Rg, Hkv, G, B]
        p = torch.exp(s - step_lse[..., None]).nan_to_num(0.0)  # rows with no mean token: all -inf
        o = torch.einsum("rhgbc,rchd->rbhgd", p, v_mean[t.keys]).flatten(2, 3)
        out[t.tokens[t.live]] = o[t.live]
        lse[t.tokens[t.live]] = step_lse.permute(0, 3, 1, 2).flatten(2, 3)[t.live]
    return out, lse


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each one's output [N, H, D] and natural
    log-sum-exp [N, H] (`lse_a` finite; `lse_b` may be -inf)."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]
