"""The Triton block-sparse kernel against fp32 attention token by token (CPU: Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch
from kvpool import scattered_batch

from sglang_prefill_ext.ops.block_attention import TritonBlockAttention, kept_starts
from sglang_prefill_ext.ops.layout import BlockLayout

BLOCK = 16


def reference(q, k_buffer, v_buffer, locs, mask, layout: BlockLayout, sm_scale: float, soft_cap: float = 0.0):
    """fp32 softmax over every causal key of a kept block or of the query's own block."""
    num_qo_heads, bsz = q.shape[1], layout.block_size
    group, mask_group = num_qo_heads // k_buffer.shape[1], num_qo_heads // mask.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    first_row = q_off = ctx_off = 0
    for prefix, extend in zip(layout.prefix_lens, layout.extend_lens, strict=True):
        ctx = prefix + extend
        slots = locs[ctx_off : ctx_off + ctx].long()
        keys, values = k_buffer[slots].float(), v_buffer[slots].float()
        pos_q, pos_k = torch.arange(prefix, ctx, device=q.device), torch.arange(ctx, device=q.device)
        block_q, block_k = pos_q // bsz, pos_k // bsz
        rows = block_q - prefix // bsz + first_row
        visible = pos_k[None, :] <= pos_q[:, None]
        for h in range(num_qo_heads):
            s = q[q_off : q_off + extend, h].float() @ keys[:, h // group].T * sm_scale
            if soft_cap:
                s = soft_cap * torch.tanh(s / soft_cap)
            kept = mask[h // mask_group][rows][:, block_k] | (block_k[None, :] == block_q[:, None])
            s = s.masked_fill(~(kept & visible), float("-inf"))
            out[q_off : q_off + extend, h] = s.softmax(-1) @ values[:, h // group]
        first_row += (ctx - 1) // bsz + 1 - prefix // bsz
        q_off += extend
        ctx_off += ctx
    return out


def _case(
    heads, mask_heads: int, prefix, extend, density: float, seed: int = 0, block: int = BLOCK, head_dim=32
):
    layout, q, k_buffer, locs = scattered_batch(heads, head_dim, prefix, extend, block, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    v_buffer = torch.randn(k_buffer.shape, generator=gen)
    mask = torch.rand(mask_heads, layout.num_rows, layout.max_key_blocks, generator=gen) < density
    return layout, q, k_buffer, v_buffer, locs, mask


@pytest.mark.parametrize(
    ("heads", "mask_heads", "soft_cap"),
    [((6, 2), 6, 0.0), ((4, 2), 2, 0.0), ((2, 1), 2, 5.0), ((3, 3), 3, 0.0)],
)
def test_matches_fp32_attention_through_the_mask(heads, mask_heads: int, soft_cap: float) -> None:
    """Prefixes off the block grid, a single-token request, shuffled slots; the random masks omit some
    diagonals (attended anyway) and keep blocks after them (never attended)."""
    layout, q, k, v, locs, mask = _case(heads, mask_heads, [0, 37, 5, 64], [90, 29, 1, 40], 0.4)
    attention = TritonBlockAttention()
    attention.plan_mask(mask, layout, locs, q, 0.3, soft_cap)
    out = attention.run(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(
        out, reference(q, k, v, locs, mask, layout, 0.3, soft_cap), atol=2e-4, rtol=2e-4
    )


def test_all_blocks_kept_is_dense_causal_attention() -> None:
    layout, q, k, v, locs, _ = _case((4, 2), 4, [48], [80], 1.0, seed=3)
    attention = TritonBlockAttention()
    attention.plan_mask(
        torch.ones(4, layout.num_rows, layout.max_key_blocks, dtype=torch.bool), layout, locs, q, 0.2
    )
    ctx = locs.long()
    keys, values = k[ctx].repeat_interleave(2, 1), v[ctx].repeat_interleave(2, 1)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=torch.arange(128)[None, :] <= torch.arange(48, 128)[:, None],
        scale=0.2,
    ).transpose(0, 1)
    torch.testing.assert_close(attention.run(q, k, v), dense, atol=2e-4, rtol=2e-4)


def test_kept_starts_lists_off_diagonal_blocks_in_order() -> None:
    layout = BlockLayout.build([20, 0], [30, 40], BLOCK)  # rows: request 0 blocks 1..3, request 1 blocks 0..2
    mask = torch.zeros(1, layout.num_rows, layout.max_key_blocks, dtype=torch.bool)
    mask[0, 2, [0, 2, 3]] = True  # request 0's block 3: blocks 0 and 2 before its diagonal (3)
    mask[0, 5, [1, 2]] = True  # request 1's block 2: block 1, then its diagonal
    starts, counts = kept_starts(mask, layout)
    assert counts.tolist() == [[0, 0, 2, 0, 0, 1]]
    assert starts[0, 2, :2].tolist() == [0, 32] and starts[0, 5, 0].item() == 50 + 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask_heads", [12, 2])
def test_bf16_on_the_gpu_matches_fp32_and_flashinfer(mask_heads: int) -> None:
    """The served shape (Qwen2.5-Coder-1.5B: 12 / 2 heads, head_dim 128, 128-token blocks), bf16, against
    fp32 attention and FlashInfer's block-sparse path on the same mask."""
    from sglang_prefill_ext.ops.attention import BlockSparseAttention

    layout, q, k, v, locs, mask = _case(
        (12, 2), mask_heads, [0, 3000], [1000, 1777], 0.2, block=128, head_dim=128
    )
    layout = BlockLayout.build(layout.prefix_lens, layout.extend_lens, 128, "cuda")
    q, k, v, locs, mask = (t.cuda() for t in (q, k, v, locs, mask))
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    scale = 128**-0.5
    want = reference(q, k, v, locs, mask, layout, scale)
    triton_attention = TritonBlockAttention()
    triton_attention.plan_mask(mask, layout, locs, q, scale)
    got = triton_attention.run(q, k, v)
    flashinfer = BlockSparseAttention(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    causal = torch.arange(layout.max_key_blocks, device="cuda")[None, :] <= layout.row_block[:, None]
    diagonal = torch.arange(layout.max_key_blocks, device="cuda")[None, :] == layout.row_block[:, None]
    flashinfer.plan_mask((mask | diagonal) & causal, layout, locs, q, scale, num_kv_heads=2)
    for out in (got, flashinfer.run(q, k, v)):
        err = (out.float() - want).norm() / want.norm()
        assert err < 1e-2, err
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
