"""The mean correction of dropped blocks: both twins against an fp64 reference, the merge of two disjoint key
sets, and exactness where every dropped block's keys are equal (then sparse + correction is dense)."""

from __future__ import annotations

import math

import pytest
import torch
from kvpool import scattered_batch

from sglang_prefill_ext.ops.correction import (
    dropped_attention_torch,
    dropped_attention_triton,
    merge_states,
    pooled_kv,
)
from sglang_prefill_ext.ops.dispatch import FLOOR
from sglang_prefill_ext.ops.exact import block_sparse_attention, block_sparse_attention_lse
from sglang_prefill_ext.ops.layout import BlockLayout
from sglang_prefill_ext.ops.selection import structural_blocks
from sglang_prefill_ext.ops.settings import SparseSettings

BLOCK = 16
HEADS = (4, 2)
DIM = 32
SCALE = DIM**-0.5


def random_mask(layout: BlockLayout, heads: int, seed: int) -> torch.Tensor:
    """Random kept blocks [heads, R, C] with the structural ones (sinks, local window, diagonal)."""
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(heads, layout.num_rows, layout.max_key_blocks, generator=gen) < 0.4
    settings = SparseSettings(block_size=BLOCK, sink_blocks=1, local_blocks=1, last_blocks=0)
    causal = torch.arange(layout.max_key_blocks)[None, :] <= layout.row_block.long()[:, None]
    return (keep & causal) | structural_blocks(layout, settings, keep.device)[None]


def reference(q, k_buffer, v_buffer, locs, layout, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 from scratch: each query's softmax over its row's dropped blocks at (mean key . q * scale +
    ln size), applied to the mean values; base-2 log-sum-exp (FLOOR where nothing is dropped)."""
    num_tokens, num_qo_heads, head_dim = q.shape
    group = num_qo_heads // k_buffer.shape[1]
    out = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=torch.float64)
    lse = torch.full((num_tokens, num_qo_heads), FLOOR, dtype=torch.float64)
    for r in range(layout.num_rows):
        req, diag = int(layout.row_req[r]), int(layout.row_block[r])
        offset = int(layout.req_key_offset[req])
        for h in range(num_qo_heads):
            mh = h if mask.shape[0] == num_qo_heads else h // group
            dropped = [c for c in range(diag) if not mask[mh, r, c]]
            if not dropped:
                continue
            kbar, vbar, size = [], [], []
            for c in dropped:
                start, length = int(layout.key_tok_start[offset + c]), int(layout.key_len[offset + c])
                slots = locs[start : start + length].long()
                kbar.append(k_buffer[slots, h // group].double().mean(0))
                vbar.append(v_buffer[slots, h // group].double().mean(0))
                size.append(length)
            kbar_t, vbar_t = torch.stack(kbar), torch.stack(vbar)
            for t in range(int(layout.row_q_len[r])):
                token = int(layout.row_q_start[r]) + t
                s = kbar_t @ q[token, h].double() * SCALE + torch.tensor(size, dtype=torch.float64).log()
                out[token, h] = torch.softmax(s, 0) @ vbar_t
                lse[token, h] = torch.logsumexp(s, 0) / math.log(2)
    return out, lse


@pytest.mark.parametrize("impl", [dropped_attention_torch, dropped_attention_triton])
@pytest.mark.parametrize("per_query_head", [True, False])
@pytest.mark.parametrize(("prefix", "extend"), [([0], [70]), ([37, 0], [29, 50])])
def test_dropped_attention_matches_reference(impl, per_query_head, prefix, extend) -> None:
    layout, q, k_buffer, locs = scattered_batch(HEADS, DIM, prefix, extend, BLOCK, seed=len(prefix))
    v_buffer = torch.randn_like(k_buffer)
    mask = random_mask(layout, HEADS[0] if per_query_head else HEADS[1], seed=3)
    kbar, vbar = pooled_kv(k_buffer, v_buffer, layout, locs)
    out, lse = impl(q, kbar, vbar, mask, layout, SCALE)
    want_out, want_lse = reference(q, k_buffer, v_buffer, locs, layout, mask)
    assert (want_lse > FLOOR).any(), "the mask drops something"
    assert (want_lse == FLOOR).any(), "some rows drop nothing (the first blocks)"
    torch.testing.assert_close(out.double(), want_out, atol=2e-3, rtol=2e-3)
    dropping = want_lse > FLOOR
    torch.testing.assert_close(lse.double()[dropping], want_lse[dropping], atol=2e-3, rtol=1e-4)
    assert (lse[~dropping] == FLOOR).all()


def test_merge_states_is_attention_over_the_union() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(5, 3, 8, generator=gen),
        torch.randn(20, 8, generator=gen),
        torch.randn(20, 8, generator=gen),
    )
    logits = torch.einsum("nhd,kd->nhk", q, k)
    parts = []
    for keys in (slice(0, 7), slice(7, 20)):
        s = logits[..., keys]
        parts += [torch.softmax(s, -1) @ v[keys], torch.logsumexp(s, -1) / math.log(2)]
    torch.testing.assert_close(merge_states(*parts), torch.softmax(logits, -1) @ v)
    floor = torch.full((5, 3), FLOOR)
    torch.testing.assert_close(merge_states(parts[0], parts[1], torch.zeros_like(parts[0]), floor), parts[0])


@pytest.mark.parametrize("per_query_head", [True, False])
def test_correction_is_exact_where_dropped_blocks_hold_equal_keys(per_query_head) -> None:
    """With every block's keys equal, a block's log-sum-exp is exactly mean logit + ln(size) and its output
    the mean value: kept blocks + correction = dense attention, whatever the mask drops."""
    length = 100
    gen = torch.Generator().manual_seed(1)
    layout = BlockLayout.build([0], [length], BLOCK)
    q = torch.randn(length, HEADS[0], DIM, generator=gen)
    per_block = torch.randn(-(-length // BLOCK), HEADS[1], DIM, generator=gen)
    k = per_block.repeat_interleave(BLOCK, 0)[:length]
    v = torch.randn(length, HEADS[1], DIM, generator=gen)
    mask = random_mask(layout, HEADS[0] if per_query_head else HEADS[1], seed=5)
    out, lse = block_sparse_attention_lse(q, k, v, SCALE, mask, BLOCK)
    kbar, vbar = pooled_kv(k, v, layout, torch.arange(length))
    merged = merge_states(out, lse, *dropped_attention_torch(q, kbar, vbar, mask, layout, SCALE))
    dense = block_sparse_attention(q, k, v, SCALE)
    assert (out - dense).abs().max() > 1e-2, "the mask changes the sparse attention"
    torch.testing.assert_close(merged, dense, atol=1e-4, rtol=1e-4)
