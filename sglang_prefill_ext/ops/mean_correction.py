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

# FlashInfer's kernels return log2(sum 2^(score * log2 e)) (fa2 prefill.cuh and fa3 attention_updater.cuh)
FLASHINFER_LSE_TO_NATURAL = math.log(2.0)
_STEP_ELEMENTS = 1 << 26  # scores per step of `mean_token_attention`


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
    num_kv_heads = k_mean.shape[1]
    group = num_qo_heads // num_kv_heads
    num_rows, num_cols = skipped.shape[1:]
    device = q.device
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float32, device=device)
    lse = torch.full((num_tokens, num_qo_heads), float("-inf"), dtype=torch.float32, device=device)
    block = layout.block_size
    cols = torch.arange(num_cols, device=device)
    within = torch.arange(block, device=device)
    step = max(1, _STEP_ELEMENTS // (block * num_qo_heads * max(num_cols, 1)))
    for r0 in range(0, num_rows, step):
        rows = torch.arange(r0, min(r0 + step, num_rows), device=device)
        if not skipped[:, rows].any():
            continue
        tokens = layout.row_q_start[rows].long()[:, None] + within  # [Rg, B]
        live = within[None, :] < layout.row_q_len[rows].long()[:, None]
        tokens = torch.where(live, tokens, 0)
        key = layout.req_key_offset[layout.row_req[rows].long()].long()[:, None] + cols
        key = key.clamp(max=k_mean.shape[0] - 1)  # [Rg, C]; columns past a request's keys are never skipped
        qg = q[tokens].float().view(len(rows), block, num_kv_heads, group, head_dim)
        s = torch.einsum("rbhgd,rchd->rhgbc", qg * sm_scale, k_mean[key])
        s = s + layout.key_len[key].float().log()[:, None, None, None, :]
        s = s.masked_fill(~skipped[:, rows].transpose(0, 1)[:, :, None, None, :], float("-inf"))
        step_lse = torch.logsumexp(s, -1)  # [Rg, Hkv, G, B]
        p = torch.exp(s - step_lse[..., None]).nan_to_num(0.0)  # rows with no mean token: all -inf
        o = torch.einsum("rhgbc,rchd->rbhgd", p, v_mean[key]).reshape(
            len(rows), block, num_qo_heads, head_dim
        )
        out[tokens[live]] = o[live]
        lse[tokens[live]] = step_lse.permute(0, 3, 1, 2).reshape(len(rows), block, num_qo_heads)[live]
    return out, lse


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each one's output [N, H, D] and natural
    log-sum-exp [N, H] (`lse_a` finite; `lse_b` may be -inf)."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]
