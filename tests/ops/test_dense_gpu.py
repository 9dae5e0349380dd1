"""On the GPU: gathered dense prefill (one causal ragged pass over each request's gathered context)
against an fp32 SDPA reference."""

from __future__ import annotations

import random

import pytest
import torch
from kvpool import assert_requests_match_sdpa, make_pool

from sglang_prefill_ext.ops.dense import GatheredPrefill

pytestmark = pytest.mark.gpu
DEVICE = "cuda"

# (cached prefix lens, new token lens)
SCENARIOS = {
    "fresh": ([0, 0], [1500, 77]),
    "chunk_over_prefix": ([6000], [2048]),
    "ragged": ([3000, 0, 129, 4096], [700, 1024, 1, 300]),
}


@pytest.fixture(scope="module")
def workspace() -> torch.Tensor:
    return torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)


def _check(
    dense: GatheredPrefill,
    prefix: list[int],
    extend: list[int],
    page: int,
    heads: tuple[int, int],
    head_dim: int,
    seed: int = 0,
) -> None:
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, page, heads[1], head_dim, device=DEVICE, seed=seed)
    q = torch.randn(sum(extend), heads[0], head_dim, device=DEVICE).bfloat16()
    dense.plan(
        pool.req_to_token,
        pool.req_pool_indices,
        prefix,
        extend,
        *heads,
        head_dim,
        torch.bfloat16,
        head_dim**-0.5,
    )
    assert_requests_match_sdpa(dense.run(q, pool.k, pool.v), q, pool, prefix, extend)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("heads", [(32, 8), (28, 4)])
def test_gathered_dense_equals_fp32_sdpa(
    workspace: torch.Tensor, scenario: str, page: int, head_dim: int, heads: tuple[int, int]
) -> None:
    prefix, extend = SCENARIOS[scenario]
    _check(GatheredPrefill(workspace), prefix, extend, page, heads, head_dim)


def test_one_instance_replans_across_batches_of_any_size(workspace: torch.Tensor) -> None:
    """The gather buffers grow and are reused: a small batch after a large one reads only its slots."""
    dense = GatheredPrefill(workspace)
    rng = random.Random(0)
    for seed in range(6):
        num_reqs = rng.randint(1, 5)
        prefix = [rng.choice([0, rng.randint(1, 6000)]) for _ in range(num_reqs)]
        extend = [rng.randint(1, 2500) for _ in range(num_reqs)]
        heads, head_dim = rng.choice([((32, 8), 128), ((28, 4), 64)])
        _check(dense, prefix, extend, rng.choice([1, 16]), heads, head_dim, seed)
