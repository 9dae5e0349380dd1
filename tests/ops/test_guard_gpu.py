"""On the GPU: the guard's decline in front of FlashInfer (its kernel on a bf16 pool: test_sparse_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from kvpool import assert_requests_match_sdpa, make_pool

from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.layout import context_locs

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


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
    settings = SparseSettings(scorer="antidiagonal", mass=1.0, guard=0.9, max_density=1.0)
    sparse = SparsePrefill(
        settings, BlockSparseAttention(torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE))
    )
    layout = BlockLayout.build([0], [total], 128, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    sparse.begin(layout, locs)
    out = sparse.attend(q, pool.k, pool.v, head_dim**-0.5, layer=0)
    assert out is not None and sparse.guard_stat == pytest.approx(1.0, abs=1e-3)
    assert_requests_match_sdpa(out, q, pool, [0], [total])
    dropped = sparse.mask.clone()
    dropped[:, row, block] = False
    sparse.begin(layout, locs)
    sparse.select = lambda q, k_buffer, sm_scale, layer=None: dropped
    assert sparse.attend(q, pool.k, pool.v, head_dim**-0.5, layer=0) is None
    assert sparse.guard_stat < 0.5 and not sparse.planned
