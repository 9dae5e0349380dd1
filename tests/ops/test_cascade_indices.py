"""Cascade index construction: the shared prefix found in req_to_token, and each request's own slots (CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kvpool import Pool, make_pool

from sglang_prefill_ext.ops.cascade import build_cascade_indices, merge_supported, shared_prefix_len


def shared_pool(
    prefix: list[int],
    extend: list[int],
    shared: int,
    page: int,
    num_kv_heads: int,
    head_dim: int,
    contiguous: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> Pool:
    """`make_pool`, then every request's first `shared` slots pointed at request 0's (at a contiguous
    run of fresh slots past the end of the pool when `contiguous`)."""
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], page, num_kv_heads, head_dim, seed=seed
    )
    rows = pool.req_pool_indices.long()
    k, v = pool.k, pool.v
    if contiguous and shared:
        gen = torch.Generator().manual_seed(seed + 1)
        fresh = torch.randn((2, shared, num_kv_heads, head_dim), generator=gen).to(k.dtype)
        pool.req_to_token[rows[0], :shared] = torch.arange(k.shape[0], k.shape[0] + shared, dtype=torch.int32)
        k, v = torch.cat([k, fresh[0]]), torch.cat([v, fresh[1]])
    pool.req_to_token[rows, :shared] = pool.req_to_token[rows[0], :shared]
    return dataclasses.replace(
        pool,
        k=k.to(device),
        v=v.to(device),
        req_to_token=pool.req_to_token.to(device),
        req_pool_indices=pool.req_pool_indices.to(device),
    )


@pytest.mark.parametrize("page", [1, 16])
def test_shared_prefix_is_the_longest_run_of_identical_leading_slots(page: int) -> None:
    prefix, extend = [3000, 2500, 4000], [10, 20, 30]
    pool = shared_pool(prefix, extend, 1777, page, 2, 8)
    assert shared_prefix_len(pool.req_to_token, pool.req_pool_indices, prefix) == 1777
    pool.req_to_token[pool.req_pool_indices[2], 1000] = -5
    assert shared_prefix_len(pool.req_to_token, pool.req_pool_indices, prefix) == 1000
    whole = shared_pool([2048, 2048], [1, 1], 2048, page, 2, 8)
    assert shared_prefix_len(whole.req_to_token, whole.req_pool_indices, [2048, 2048]) == 2048
    assert shared_prefix_len(pool.req_to_token, pool.req_pool_indices, [3000, 0, 4000]) == 0
    assert shared_prefix_len(pool.req_to_token, pool.req_pool_indices[:1], [3000]) == 3000


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("shared", [0, 100, 2048])
def test_own_indices_are_each_requests_slots_after_the_shared_prefix(shared: int, contiguous: bool) -> None:
    prefix, extend = [2048, 3000, 2100], [5, 700, 1]
    pool = shared_pool(prefix, extend, shared, 16, 2, 8, contiguous)
    idx = build_cascade_indices(pool.req_to_token, pool.req_pool_indices, prefix, extend, shared)
    assert idx.num_requests == 3 and idx.num_tokens == sum(extend)
    assert idx.own_qo_indptr.tolist() == [0, 5, 705, 706]
    own = [p + n - shared for p, n in zip(prefix, extend, strict=True)]
    assert idx.own_kv_indptr.tolist() == [0, own[0], own[0] + own[1], sum(own)]
    rows = pool.req_pool_indices.long()
    want = torch.cat(
        [pool.req_to_token[r, shared : p + n] for r, p, n in zip(rows, prefix, extend, strict=True)]
    )
    assert torch.equal(idx.own_kv_indices, want)
    assert torch.equal(idx.shared_locs, pool.req_to_token[rows[0], :shared])
    assert idx.own_kv_indices.dtype == idx.shared_locs.dtype == torch.int32
    if contiguous and shared:
        assert idx.shared_start == pool.k.shape[0] - shared
    else:
        assert idx.shared_start is None


def test_shared_len_beyond_a_prefix_is_refused() -> None:
    pool = shared_pool([100, 50], [1, 1], 50, 1, 2, 8)
    with pytest.raises(ValueError):
        build_cascade_indices(pool.req_to_token, pool.req_pool_indices, [100, 50], [1, 1], 51)


def test_merge_kernel_head_limit() -> None:
    assert merge_supported(32, 128, torch.bfloat16)
    assert merge_supported(64, 128, torch.bfloat16)
    assert not merge_supported(128, 128, torch.bfloat16)
    assert merge_supported(128, 64, torch.bfloat16)
