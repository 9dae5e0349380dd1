"""On the GPU: FlashInfer's log-sum-exp over the kept blocks, the Triton mean correction against its torch twin,
and the policy's corrected attention against an fp32 softmax over kept keys and dropped blocks' means."""

from __future__ import annotations

import math

import pytest
import torch
from kvpool import make_pool, request_kv, token_keep_mask

from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.correction import dropped_attention_torch, dropped_attention_triton, pooled_kv
from sglang_prefill_ext.ops.layout import context_locs

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
PREFIX, EXTEND = [2000, 0], [1500, 700]
HEADS, DIM, BLOCK = (12, 2), 128, 128


def _batch(per_query_head: bool, density: float = 0.3):
    pool = make_pool([p + n for p, n in zip(PREFIX, EXTEND, strict=True)], 1, HEADS[1], DIM, device=DEVICE)
    layout = BlockLayout.build(PREFIX, EXTEND, BLOCK, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    mask_heads = HEADS[0] if per_query_head else HEADS[1]
    cols = torch.arange(layout.max_key_blocks, device=DEVICE)[None, :]
    diag = layout.row_block.long()[:, None]
    rand = torch.rand(mask_heads, layout.num_rows, layout.max_key_blocks, device=DEVICE) < density
    mask = (rand | (cols == diag) | (cols == 0)) & (cols <= diag)
    q = torch.randn(layout.num_tokens, HEADS[0], DIM, device=DEVICE).bfloat16()
    return pool, layout, locs, mask, q


def _reference(q, pool, layout, mask, corrected: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 on the CPU: each query's softmax over its kept keys and (with `corrected`) one pseudo-key per dropped
    block (logit scale * q . mean key + ln size, value the mean value); output and base-2 log-sum-exp."""
    group = HEADS[0] // HEADS[1]
    outs, lses = [], []
    offset = 0
    for b, (p, n) in enumerate(zip(PREFIX, EXTEND, strict=True)):
        k, v = (t.float().cpu() for t in request_kv(pool, b, p + n))
        rows = (layout.row_req == b).nonzero().flatten().cpu()
        keep = token_keep_mask(
            mask[:, rows].cpu(), layout.row_block[rows].cpu(), torch.arange(p, p + n), p + n, BLOCK
        )
        keep = keep.repeat_interleave(HEADS[0] // keep.shape[1], 1)  # [n, Hq, ctx]
        pos = torch.arange(p, p + n)
        causal = torch.arange(p + n)[None, :] <= pos[:, None]
        qq = q[offset : offset + n].float().cpu()
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        logits = torch.einsum("nhd,lhd->nhl", qq, kk) * DIM**-0.5
        logits = logits.masked_fill(~(keep & causal[:, None]), -math.inf)
        if corrected:
            blocks = -(-(p + n) // BLOCK)
            kbar = torch.stack([kk[c * BLOCK : (c + 1) * BLOCK].mean(0) for c in range(blocks)])  # [C, Hq, D]
            vbar = torch.stack([vv[c * BLOCK : (c + 1) * BLOCK].mean(0) for c in range(blocks)])
            size = torch.tensor([min(BLOCK, p + n - c * BLOCK) for c in range(blocks)]).float()
            block_logits = torch.einsum("nhd,chd->nhc", qq, kbar) * DIM**-0.5 + size.log()
            diag = (pos // BLOCK)[:, None, None]
            seen = keep[:, :, ::BLOCK][:, :, :blocks]  # a block's first key stands for the block
            dropped = (torch.arange(blocks)[None, None, :] < diag) & ~seen
            logits = torch.cat([logits, block_logits.masked_fill(~dropped, -math.inf)], -1)
        weights = torch.softmax(logits, -1)
        out = torch.einsum("nhl,lhd->nhd", weights[..., : p + n], vv)
        if corrected:
            out = out + torch.einsum("nhc,chd->nhd", weights[..., p + n :], vbar)
        outs.append(out)
        lses.append(torch.logsumexp(logits, -1) / math.log(2))
        offset += n
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("per_query_head", [False, True])
def test_run_with_lse_returns_the_kept_blocks_log_sum_exp(per_query_head: bool) -> None:
    pool, layout, locs, mask, q = _batch(per_query_head)
    sparse = SparsePrefill(
        SparseSettings(max_density=1.0),
        BlockSparseAttention(torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)),
    )
    sparse.begin(layout, locs)
    sparse.plan(mask, q, DIM**-0.5, num_kv_heads=HEADS[1])
    out, lse = sparse.attention.run_with_lse(q, pool.k, pool.v)
    assert torch.equal(out, sparse.attention.run(q, pool.k, pool.v))
    want_out, want_lse = _reference(q, pool, layout, mask, corrected=False)
    torch.testing.assert_close(out.float().cpu(), want_out, atol=5e-3, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("per_query_head", [False, True])
def test_triton_dropped_attention_matches_torch(per_query_head: bool) -> None:
    pool, layout, locs, mask, q = _batch(per_query_head, density=0.2)
    kbar, vbar = pooled_kv(pool.k, pool.v, layout, locs)
    got = dropped_attention_triton(q, kbar, vbar, mask, layout, DIM**-0.5)
    want = dropped_attention_torch(q, kbar, vbar, mask, layout, DIM**-0.5)
    torch.testing.assert_close(got[0], want[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], want[1], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("per_query_head", [False, True])
def test_corrected_policy_attends_to_kept_keys_and_dropped_means(per_query_head: bool) -> None:
    pool, layout, locs, mask, q = _batch(per_query_head, density=0.2)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    sparse = SparsePrefill(SparseSettings(max_density=1.0, correct=True), BlockSparseAttention(workspace))
    sparse.begin(layout, locs)
    sparse.plan(mask, q, DIM**-0.5, num_kv_heads=HEADS[1])
    got = sparse.run(q, pool.k, pool.v)
    want, _ = _reference(q, pool, layout, mask, corrected=True)
    plain, _ = _reference(q, pool, layout, mask, corrected=False)
    assert (want - plain).abs().max() > 2e-2, "the correction changes the output"
    torch.testing.assert_close(got.float().cpu(), want, atol=1e-2, rtol=2e-2)
