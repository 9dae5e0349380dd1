"""On the GPU: FlashInfer block-sparse prefill against an fp32 SDPA reference, and planted needles."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kvpool import assert_requests_match_sdpa, make_pool, request_kv, sdpa_reference

from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.guard import kept_share
from sglang_prefill_ext.ops.layout import context_locs
from sglang_prefill_ext.ops.scorers.pooled import (
    key_segments,
    pool_keys,
    pool_queries,
    query_segments,
    segment_mean_torch,
    select_pooled_torch,
)
from sglang_prefill_ext.ops.scorers.sampled import (
    block_mass_torch,
    block_mass_triton,
    row_mass_torch,
    row_mass_triton,
)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def _sparse(settings: SparseSettings) -> SparsePrefill:
    """The policy over `settings`, never declining for density (the tests compare what it runs)."""
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    return SparsePrefill(dataclasses.replace(settings, max_density=1.0), BlockSparseAttention(workspace))


def _run_chunk(
    sparse: SparsePrefill, pool, prefix: list[int], extend: list[int], q: torch.Tensor
) -> torch.Tensor:
    layout = BlockLayout.build(prefix, extend, sparse.settings.block_size, DEVICE)
    sparse.begin(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
    return sparse.attend(q, pool.k, pool.v, q.shape[-1] ** -0.5, layer=0)


SCENARIOS = {
    "ragged": ([0, 0, 0], [1000, 300, 2500]),
    "cached_prefix": ([3000, 517, 0], [700, 1200, 64]),
}


KEEP_ALL = {
    "hybrid": SparseSettings(scorer="hybrid", threshold=0.0, mass=1.0, per_query_head=False),
    "pooled": SparseSettings(scorer="pooled", threshold=0.0, per_query_head=False),
    "sampled": SparseSettings(scorer="sampled", mass=1.0, per_query_head=False),
    "hybrid_per_query_head": SparseSettings(scorer="hybrid", threshold=0.0, mass=1.0, per_query_head=True),
    "antidiagonal_per_query_head": SparseSettings(scorer="antidiagonal", mass=1.0, per_query_head=True),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("heads", [(32, 8), (28, 4)])
@pytest.mark.parametrize("scorer", sorted(KEEP_ALL))
def test_all_blocks_kept_equals_fp32_sdpa(
    scenario: str, page: int, head_dim: int, heads: tuple[int, int], scorer: str
) -> None:
    prefix, extend = SCENARIOS[scenario]
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, page, heads[1], head_dim, device=DEVICE)
    q = torch.randn(sum(extend), heads[0], head_dim, device=DEVICE).bfloat16()
    out = _run_chunk(_sparse(KEEP_ALL[scorer]), pool, prefix, extend, q)
    assert_requests_match_sdpa(out, q, pool, prefix, extend)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((28, 4), 64)])
def test_chunked_prefill_equals_fp32_sdpa(page: int, heads: tuple[int, int], head_dim: int) -> None:
    total, chunk = 5000, 1500  # chunks start mid-block
    pool = make_pool([total], page, heads[1], head_dim, device=DEVICE)
    sparse = _sparse(KEEP_ALL["pooled"])
    q = torch.randn(total, heads[0], head_dim, device=DEVICE).bfloat16()
    k, v = request_kv(pool, 0, total)
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        out = _run_chunk(sparse, pool, [start], [n], q[start : start + n])
        want = sdpa_reference(q[start : start + n], k[: start + n], v[: start + n])
        torch.testing.assert_close(out.float(), want, atol=5e-3, rtol=2e-2)


def _plant_needles(q: torch.Tensor, pool, num: int, seed: int) -> list[tuple[int, int, int, bool]]:
    """Add a shared direction to one query head's block and to one key block or, every other needle,
    to a single key token: (kv head, q block, k block, token)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = q.shape[0] // 128
    group = q.shape[1] // pool.k.shape[1]
    needles = []
    for n in range(num):
        qb = int(torch.randint(8, num_blocks, (1,), generator=gen))
        kb = int(torch.randint(1, qb - 4, (1,), generator=gen))
        qh = int(torch.randint(0, q.shape[1], (1,), generator=gen))
        token = n % 2 == 1
        u = torch.randn(q.shape[-1], generator=gen).to(DEVICE)
        u = (16.0 if token else 8.0) * u / u.norm()
        q[qb * 128 : (qb + 1) * 128, qh] += u.to(q.dtype)
        keys = slice(kb * 128 + 77, kb * 128 + 78) if token else slice(kb * 128, (kb + 1) * 128)
        locs = pool.req_to_token[pool.req_pool_indices[0], keys].long()
        pool.k[locs, qh // group] += u.to(pool.k.dtype)
        needles.append((qh // group, qb, kb, token))
    return needles


@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((28, 4), 64)])
@pytest.mark.parametrize("scorer", ["hybrid", "sampled", "pooled"])
def test_planted_needles_are_always_selected_per_kv_head_at_mass_0_95(
    heads: tuple[int, int], head_dim: int, scorer: str
) -> None:
    """Every needle with the hybrid and the sampled scorer (per KV head, mass 0.95: the defaults until
    2026-12-02); the pooled scorer only promises whole-block ones (a single key token is diluted 1/128 in
    its block's mean)."""
    total = 16384
    pool = make_pool([total], 1, heads[1], head_dim, device=DEVICE)
    q = torch.randn(total, heads[0], head_dim, device=DEVICE).bfloat16()
    needles = _plant_needles(q, pool, 24, seed=7)
    sparse = _sparse(SparseSettings(scorer=scorer, mass=0.95, per_query_head=False))
    layout = BlockLayout.build([0], [total], 128, DEVICE)
    sparse.begin(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
    mask = sparse.select(q, pool.k, head_dim**-0.5)
    promised = [n for n in needles if scorer != "pooled" or not n[3]]
    missed = [n for n in promised if not bool(mask[n[:3]])]
    assert not missed, f"needles not selected: {missed}"


@pytest.mark.parametrize(
    ("heads", "head_dim", "samples"), [((32, 8), 128, 2), ((12, 2), 128, 2), ((9, 3), 64, 3)]
)
def test_sampled_mass_kernel_matches_torch_on_gpu(
    heads: tuple[int, int], head_dim: int, samples: int
) -> None:
    prefix, extend = [2000, 0, 300], [900, 3000, 5]
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], 16, heads[1], head_dim, device=DEVICE
    )
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE).bfloat16()
    got = block_mass_triton(q, pool.k, locs, layout, samples, head_dim**-0.5)
    want = block_mass_torch(q, pool.k, locs, layout, samples, head_dim**-0.5)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)
    # the guard's rows before their mean (the CPU interpreter cannot check bf16), and their kept shares
    rows = row_mass_triton(q, pool.k, locs, layout, samples, head_dim**-0.5)
    want_rows = row_mass_torch(q, pool.k, locs, layout, samples, head_dim**-0.5)
    torch.testing.assert_close(rows, want_rows, atol=2e-3, rtol=2e-2)
    keep = torch.rand(heads[0], layout.num_rows, layout.max_key_blocks, device=DEVICE) < 0.3
    torch.testing.assert_close(kept_share(rows, keep), kept_share(want_rows, keep), atol=5e-3, rtol=2e-2)


def test_triton_pooling_and_selection_match_torch_on_gpu() -> None:
    prefix, extend = [2000, 0], [900, 3000]
    pool = make_pool([p + n for p, n in zip(prefix, extend, strict=True)], 16, 8, 128, device=DEVICE)
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = torch.randn(layout.num_tokens, 32, 128, device=DEVICE).bfloat16()
    qpool, kpool = pool_queries(q, layout), pool_keys(pool.k, key_segments(layout, locs))
    torch.testing.assert_close(qpool, segment_mean_torch(q, query_segments(layout)))
    torch.testing.assert_close(kpool, segment_mean_torch(pool.k, key_segments(layout, locs)))
    settings = SparseSettings(scorer="pooled", threshold=0.5)
    sparse = _sparse(settings)
    sparse.begin(layout, locs)
    got = sparse.select(q, pool.k, 0.5)
    want = select_pooled_torch(qpool, kpool, layout, settings, 0.5)
    assert float((got != want).float().mean()) < 1e-3


def test_direct_plan_runs_exactly_what_flashinfers_public_plan_runs() -> None:
    """Bitwise: one plan per batch through the direct path, then the same batch through `plan(fast=False)`;
    batches alternate between many and few segments so stale state from a larger plan would show."""
    from sglang_prefill_ext.ops.plan import build_plan_indices

    heads, head_dim = (32, 8), 128
    attention = _sparse(SparseSettings()).attention
    for prefix, extend, density in (([0], [8192], 0.1), ([3000, 0], [700, 64], 0.5), ([0], [4096], 0.3)):
        ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
        pool = make_pool(ctx, 1, heads[1], head_dim, device=DEVICE)
        layout = BlockLayout.build(prefix, extend, 128, DEVICE)
        locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
        cols = torch.arange(layout.max_key_blocks, device=DEVICE)[None, :]
        diag = layout.row_block.long()[:, None]
        rand = torch.rand(heads[1], layout.num_rows, layout.max_key_blocks, device=DEVICE) < density
        indices = build_plan_indices((rand | (cols == diag)) & (cols <= diag), layout, locs)
        q = torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE).bfloat16()
        outs = []
        for fast in (True, False):
            attention.plan(indices, heads[0], heads[1], head_dim, q.dtype, head_dim**-0.5, fast=fast)
            outs.append(attention.run(q, pool.k, pool.v))
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(("heads", "head_dim"), [((12, 2), 128), ((32, 8), 128), ((28, 4), 64)])
@pytest.mark.parametrize("per_query_head", [False, True])
def test_random_masks_run_what_an_fp32_masked_reference_computes(
    heads: tuple[int, int], head_dim: int, per_query_head: bool
) -> None:
    """FlashInfer over a random kept-block mask per KV head or per query head (each query head its own
    blocks, one query head per segment reading its KV head's pages), with a cached prefix, against fp32
    attention restricted to the same blocks."""
    from kvpool import causal_attention, token_keep_mask

    from sglang_prefill_ext.ops.plan import build_plan_indices

    prefix, extend = [2000, 0], [1500, 700]
    mask_heads = heads[0] if per_query_head else heads[1]
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], 1, heads[1], head_dim, device=DEVICE
    )
    sparse = _sparse(SparseSettings())
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    sparse.begin(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
    cols = torch.arange(layout.max_key_blocks, device=DEVICE)[None, :]
    diag = layout.row_block.long()[:, None]
    rand = torch.rand(mask_heads, layout.num_rows, layout.max_key_blocks, device=DEVICE) < 0.3
    mask = (rand | (cols == diag)) & (cols <= diag)
    assert (
        build_plan_indices(mask, layout, sparse._locs, heads[1]).num_segments == mask_heads * layout.num_rows
    )
    q = torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE).bfloat16()
    sparse.plan(mask, q, head_dim**-0.5, num_kv_heads=heads[1])
    out = sparse.attention.run(q, pool.k, pool.v)
    assert out.is_contiguous()  # the backend views it as [N, Hq x D]
    group = heads[0] // mask_heads
    offset = 0
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        k, v = request_kv(pool, b, p + n)
        rows = (layout.row_req == b).nonzero().flatten()
        keep = token_keep_mask(
            mask[:, rows].cpu(), layout.row_block[rows].cpu(), torch.arange(p, p + n), p + n, 128
        )
        want = causal_attention(
            q[offset : offset + n].cpu(), k.cpu(), v.cpu(), keep.repeat_interleave(group, 1)
        )
        torch.testing.assert_close(out[offset : offset + n].float().cpu(), want, atol=5e-3, rtol=2e-2)
        offset += n


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("per_query_head", [False, True])
def test_one_reusable_plan_serves_a_later_layers_mask(per_query_head: bool, backend: str) -> None:
    """Planned reusable for one mask, fa2 (KV split off) and fa3 (work items' KV ranges rewritten) run
    another mask of the same segments from device indices (`use_indices`) exactly as a fresh plan of it
    does."""
    from sglang_prefill_ext.ops.plan import build_plan_indices, causal_tokens, device_plan_indices

    heads, head_dim = (12, 2), 128
    prefix, extend = [3000, 0], [2500, 900]
    mask_heads = heads[0] if per_query_head else heads[1]
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], 1, heads[1], head_dim, device=DEVICE
    )
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    cols = torch.arange(layout.max_key_blocks, device=DEVICE)[None, :]
    diag = layout.row_block.long()[:, None]
    first, later = (
        ((torch.rand(mask_heads, layout.num_rows, layout.max_key_blocks, device=DEVICE) < d) | (cols == diag))
        & (cols <= diag)
        for d in (0.2, 0.5)
    )
    q = torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE).bfloat16()
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    scale = head_dim**-0.5
    fresh = BlockSparseAttention(workspace, backend)
    fresh.plan(
        build_plan_indices(later, layout, locs, heads[1]), heads[0], mask_heads, head_dim, q.dtype, scale
    )
    once = BlockSparseAttention(torch.empty_like(workspace), backend)
    indices = build_plan_indices(first, layout, locs, heads[1])
    once.plan(indices, heads[0], mask_heads, head_dim, q.dtype, scale, reusable=True)
    assert once.backend == backend
    buffer = torch.empty(causal_tokens(layout, mask_heads), dtype=torch.int32, device=DEVICE)
    once.use_indices(*device_plan_indices(later, layout, locs, heads[1], buffer))
    want = fresh.run(q, pool.k, pool.v)
    torch.testing.assert_close(once.run(q, pool.k, pool.v), want, atol=2e-3, rtol=1e-2)
