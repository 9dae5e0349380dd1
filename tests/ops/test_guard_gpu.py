"""On the GPU: the guard's compiled kernel on a bf16 pool (the CPU interpreter cannot run bf16 dot products
right), and the guard's decline in front of FlashInfer."""

from __future__ import annotations

import pytest
import torch
from kvpool import assert_requests_match_sdpa, make_pool

from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.guard import kept_share
from sglang_prefill_ext.ops.layout import context_locs
from sglang_prefill_ext.ops.sampled import row_mass_torch, row_mass_triton

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


@pytest.mark.parametrize(
    ("heads", "head_dim", "samples"), [((32, 8), 128, 2), ((12, 2), 128, 2), ((9, 3), 64, 3)]
)
def test_row_mass_kernel_matches_torch_on_a_bf16_pool(
    heads: tuple[int, int], head_dim: int, samples: int
) -> None:
    prefix, extend = [2000, 0, 300], [900, 3000, 5]
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], 16, heads[1], head_dim, device=DEVICE
    )
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE).bfloat16()
    got = row_mass_triton(q, pool.k, locs, layout, samples, head_dim**-0.5)
    want = row_mass_torch(q, pool.k, locs, layout, samples, head_dim**-0.5)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)
    keep = torch.rand(heads[0], layout.num_rows, layout.max_key_blocks, device=DEVICE) < 0.3
    torch.testing.assert_close(kept_share(got, keep), kept_share(want, keep), atol=5e-3, rtol=2e-2)


def test_a_dropped_needle_declines_before_flashinfer_and_keeping_everything_runs_it() -> None:
    """One query block of every head seeks one key token; a selection without its block is declined at
    guard 0.9, every block kept passes (statistic 1) and attends like fp32 SDPA."""
    total, heads, head_dim = 8192, (12, 2), 128
    pool = make_pool([total], 16, heads[1], head_dim, device=DEVICE)
    q = torch.randn(total, heads[0], head_dim, device=DEVICE).bfloat16()
    row, block = 50, 7
    needle = torch.randn(head_dim, device=DEVICE)
    needle = 16.0 * needle / needle.norm()
    q[row * 128 : (row + 1) * 128] += needle.bfloat16()
    pool.k[pool.req_to_token[pool.req_pool_indices[0], block * 128 + 77].long()] += needle.bfloat16()
    settings = SparseSettings(scorer="antidiagonal", mass=1.0, guard=0.9)
    sparse = SparsePrefill(
        settings, BlockSparseAttention(torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE))
    )
    layout = BlockLayout.build([0], [total], 128, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    sparse.begin(layout, locs)
    out = sparse.attend(q, pool.k, pool.v, head_dim**-0.5, layer=0, per_layer=True)
    assert out is not None and sparse.guard_stat == pytest.approx(1.0, abs=1e-3)
    assert_requests_match_sdpa(out, q, pool, [0], [total])
    dropped = sparse.mask.clone()
    dropped[:, row, block] = False
    sparse.begin(layout, locs)
    sparse.select = lambda q, k_buffer, sm_scale: dropped
    assert sparse.attend(q, pool.k, pool.v, head_dim**-0.5, layer=0, per_layer=True) is None
    assert sparse.guard_stat < 0.5 and not sparse.planned
