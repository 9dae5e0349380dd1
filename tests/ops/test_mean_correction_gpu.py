"""On the GPU: FlashInfer's block-sparse output and LSE merged with the mean tokens of the skipped
blocks, against the fp32 torch reference and, when skipped blocks hold equal keys, against dense; the
mean-token kernel against torch."""

from __future__ import annotations

import pytest
import torch
from kvpool import assert_requests_match_sdpa, make_pool, request_kv

from sglang_prefill_ext.ops import BlockLayout, BlockSparsePrefill, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.layout import context_locs
from sglang_prefill_ext.ops.mean_correction import (
    block_means,
    mean_token_attention_reference,
    mean_token_attention_triton,
    skipped_visible,
)
from sglang_prefill_ext.ops.reference import block_sparse_attention

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
SETTINGS = SparseSettings(mean_correction=True)


def _run_random_plan(pool, q: torch.Tensor, layout: BlockLayout) -> tuple[SparsePrefill, torch.Tensor]:
    """Plan a random causal mask keeping ~30 % of the blocks and every diagonal, and run it."""
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    sparse = SparsePrefill(SETTINGS, BlockSparsePrefill(workspace))
    sparse.begin(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shape = (pool.k.shape[1], layout.num_rows, layout.max_key_blocks)
    cols = torch.arange(layout.max_key_blocks, device=DEVICE)[None, :]
    diag = layout.row_block.long()[:, None]
    mask = ((torch.rand(shape, generator=gen, device=DEVICE) < 0.3) | (cols == diag)) & (cols <= diag)
    scale = q.shape[-1] ** -0.5
    sparse.plan(mask, q, scale)
    return sparse, sparse.run(q, pool.k, pool.v, scale)


@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((9, 3), 64)])
def test_real_path_equals_fp32_reference(heads: tuple[int, int], head_dim: int) -> None:
    length = 4000
    pool = make_pool([length], 16, heads[1], head_dim, device=DEVICE)
    q = torch.randn(length, heads[0], head_dim, device=DEVICE).bfloat16()
    sparse, out = _run_random_plan(pool, q, BlockLayout.build([0], [length], SETTINGS.block_size, DEVICE))
    k, v = request_kv(pool, 0, length)
    kept, lse = block_sparse_attention(q, k, v, head_dim**-0.5, sparse.mask, SETTINGS.block_size)
    want = sparse.mean_correct(q, pool.k, pool.v, kept, lse, head_dim**-0.5)
    torch.testing.assert_close(out.float(), want, atol=5e-3, rtol=2e-2)


@pytest.mark.parametrize(
    ("prefix", "extend"), [([0, 0, 0], [1000, 300, 2500]), ([3000, 517, 0], [700, 1200, 64])]
)
def test_equal_key_blocks_make_the_corrected_path_dense(prefix: list[int], extend: list[int]) -> None:
    heads, head_dim = (32, 8), 128
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, 16, heads[1], head_dim, device=DEVICE)
    for b, n in enumerate(ctx):
        locs = pool.req_to_token[pool.req_pool_indices[b], :n].long()
        for start in range(0, n, SETTINGS.block_size):
            block = locs[start : start + SETTINGS.block_size]
            pool.k[block] = pool.k[block[:1]]
    q = torch.randn(sum(extend), heads[0], head_dim, device=DEVICE).bfloat16()
    sparse, out = _run_random_plan(pool, q, BlockLayout.build(prefix, extend, SETTINGS.block_size, DEVICE))
    assert_requests_match_sdpa(out, q, pool, prefix, extend)


@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((9, 3), 64)])
def test_mean_token_kernel_matches_torch_on_gpu(heads: tuple[int, int], head_dim: int) -> None:
    prefix, extend = [2000, 0, 300], [900, 3000, 5]
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], 16, heads[1], head_dim, device=DEVICE
    )
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    k_mean, v_mean = block_means(
        pool.k, pool.v, layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    )
    q = torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE).bfloat16()
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    mask = torch.rand(heads[1], layout.num_rows, layout.max_key_blocks, generator=gen, device=DEVICE) < 0.3
    skipped = skipped_visible(mask, layout)
    got = mean_token_attention_triton(q, k_mean, v_mean, skipped, layout, head_dim**-0.5)
    want = mean_token_attention_reference(q, k_mean, v_mean, skipped, layout, head_dim**-0.5)
    torch.testing.assert_close(got[0], want[0], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got[1], want[1], atol=1e-3, rtol=1e-3)
