"""On the GPU: shared-prefix cascade attention against an fp32 SDPA reference over each request's context."""

from __future__ import annotations

import random

import pytest
import torch
from kvpool import assert_requests_match_sdpa
from test_cascade_indices import shared_pool

from sglang_prefill_ext.ops.cascade import CascadePrefill, build_cascade_indices, shared_prefix_len

pytestmark = pytest.mark.gpu
DEVICE = "cuda"

# (cached prefix lens, new token lens, shared prefix len)
SCENARIOS = {
    "no_shared": ([0, 0, 0], [300, 1000, 77], 0),
    "partial": ([3000, 2100, 2500], [700, 64, 1300], 2048),
    "all_prefix": ([2048, 2048, 2048, 2048], [512, 100, 1, 900], 2048),
    "mixed_own": ([1500, 1500, 2600], [1, 333, 1024], 1500),
}


@pytest.fixture(scope="module")
def workspace() -> torch.Tensor:
    return torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)


def _check(
    workspace: torch.Tensor,
    prefix: list[int],
    extend: list[int],
    shared: int,
    page: int,
    heads: tuple[int, int],
    head_dim: int,
    contiguous: bool,
) -> None:
    pool = shared_pool(prefix, extend, shared, page, heads[1], head_dim, contiguous, DEVICE)
    assert shared_prefix_len(pool.req_to_token, pool.req_pool_indices, prefix) >= shared
    q = torch.randn(sum(extend), heads[0], head_dim, device=DEVICE).bfloat16()
    indices = build_cascade_indices(pool.req_to_token, pool.req_pool_indices, prefix, extend, shared)
    assert (indices.shared_start is not None) == (contiguous and shared > 0)
    cascade = CascadePrefill(workspace)
    cascade.plan(indices, heads[0], heads[1], head_dim, torch.bfloat16, head_dim**-0.5)
    out = cascade.run(q, pool.k, pool.v)
    assert_requests_match_sdpa(out, q, pool, prefix, extend)


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("heads", [(32, 8), (28, 4)])
def test_cascade_equals_fp32_sdpa(
    workspace: torch.Tensor, contiguous: bool, scenario: str, page: int, head_dim: int, heads: tuple[int, int]
) -> None:
    prefix, extend, shared = SCENARIOS[scenario]
    _check(workspace, prefix, extend, shared, page, heads, head_dim, contiguous)


@pytest.mark.parametrize("seed", range(8))
def test_cascade_equals_fp32_sdpa_on_random_shapes(workspace: torch.Tensor, seed: int) -> None:
    rng = random.Random(seed)
    num_reqs = rng.randint(2, 6)
    base = rng.choice([0, rng.randint(1, 4096)])
    prefix = [base + rng.choice([0, rng.randint(1, 1500)]) for _ in range(num_reqs)]
    extend = [rng.randint(1, 1200) for _ in range(num_reqs)]
    shared = rng.choice([0, min(prefix), rng.randint(0, min(prefix))])
    heads, head_dim = rng.choice([((32, 8), 128), ((28, 4), 64), ((32, 8), 64), ((28, 4), 128)])
    _check(workspace, prefix, extend, shared, rng.choice([1, 16]), heads, head_dim, rng.random() < 0.5)
