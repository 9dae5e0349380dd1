"""The exact chunked reference attention and the mean correction of skipped blocks, on the CPU."""

from __future__ import annotations

import pytest
import torch
from kvpool import causal_attention, make_pool, request_kv, sdpa_reference, token_keep_mask

from sglang_prefill_ext.ops import BlockLayout, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.layout import context_locs
from sglang_prefill_ext.ops.mean_correction import (
    block_means,
    mean_token_attention_reference,
    mean_token_attention_triton,
    skipped_visible,
)
from sglang_prefill_ext.ops.reference import block_sparse_attention, exact_block_mass

BLOCK = 32


def _random_mask(num_kv_heads: int, num_blocks: int, seed: int) -> torch.Tensor:
    """Causal block mask [Hkv, R, R] keeping about half the blocks, the diagonal always."""
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(num_kv_heads, num_blocks, num_blocks, generator=gen) < 0.5
    return (keep | torch.eye(num_blocks, dtype=torch.bool)) & torch.ones(num_blocks, num_blocks).tril().bool()


@pytest.mark.parametrize(("heads", "length", "chunk"), [((4, 2), 300, 64), ((9, 3), 257, 1000)])
def test_chunked_dense_attention_equals_sdpa(heads: tuple[int, int], length: int, chunk: int) -> None:
    q = torch.randn(length, heads[0], 16)
    k, v = torch.randn(2, length, heads[1], 16)
    out, lse = block_sparse_attention(q, k, v, 16**-0.5, chunk=chunk)
    torch.testing.assert_close(out, sdpa_reference(q, k, v), atol=1e-5, rtol=1e-5)
    s = torch.einsum("nhd,lhd->hnl", q, k.repeat_interleave(heads[0] // heads[1], 1)) * 16**-0.5
    s = s.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1).T, atol=1e-5, rtol=1e-5)


def test_exact_block_mass_sums_the_attention_by_block() -> None:
    length, heads = 200, (6, 2)
    q = torch.randn(length, heads[0], 16)
    k = torch.randn(length, heads[1], 16)
    mass = exact_block_mass(q, k, 16**-0.5, BLOCK, chunk=64)
    s = torch.einsum("nhd,lhd->hnl", q, k.repeat_interleave(3, 1)) * 16**-0.5
    p = s.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf")).softmax(-1)
    blocks = torch.arange(length) // BLOCK
    want = torch.zeros(heads[1], 7, 7)
    for h in range(heads[0]):
        for i in range(length):
            want[h // 3, blocks[i]].index_add_(0, blocks, p[h, i])
    torch.testing.assert_close(mass, want, atol=1e-5, rtol=1e-5)
    assert torch.all(mass.triu(1) == 0)


def test_chunked_sparse_attention_equals_masked_attention() -> None:
    length, heads = 200, (6, 2)
    q = torch.randn(length, heads[0], 16)
    k, v = torch.randn(2, length, heads[1], 16)
    mask = _random_mask(heads[1], -(-length // BLOCK), seed=1)
    out, _ = block_sparse_attention(q, k, v, 16**-0.5, mask, BLOCK, chunk=48)
    layout = BlockLayout.build([0], [length], BLOCK)
    keep = token_keep_mask(mask, layout.row_block, torch.arange(length), length, BLOCK)
    want = causal_attention(q, k, v, keep.repeat_interleave(heads[0] // heads[1], 1))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [256, 250])
def test_mean_correction_is_exact_when_skipped_blocks_hold_equal_keys(length: int) -> None:
    """A block of n equal keys contributes n equal weights times its mean value: one mean token with
    score + log n, so sparse + correction equals dense whatever the selection skipped."""
    heads, head_dim = (8, 2), 16
    pool = make_pool([length], 16, heads[1], head_dim, dtype=torch.float32, seed=3)
    locs_of = pool.req_to_token[pool.req_pool_indices[0], :length].long()
    for start in range(0, length, BLOCK):
        block = locs_of[start : start + BLOCK]
        pool.k[block] = pool.k[block[:1]]
    k, v = request_kv(pool, 0, length)
    q = 3.0 * torch.randn(length, heads[0], head_dim)
    layout = BlockLayout.build([0], [length], BLOCK)
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK, mean_correction=True), None)
    sparse.begin(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
    sparse.mask = _random_mask(heads[1], layout.num_rows, seed=4)
    assert skipped_visible(sparse.mask, layout).any()
    out, lse = block_sparse_attention(q, k, v, head_dim**-0.5, sparse.mask, BLOCK)
    corrected = sparse.mean_correct(q, pool.k, pool.v, out, lse, head_dim**-0.5)
    dense, _ = block_sparse_attention(q, k, v, head_dim**-0.5)
    torch.testing.assert_close(corrected, dense, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, dense, atol=1e-3)  # the skipped blocks did matter


def test_skipped_visible_excludes_kept_diagonal_and_future_blocks() -> None:
    layout = BlockLayout.build([0], [5 * BLOCK], BLOCK)
    mask = _random_mask(2, 5, seed=5)
    skipped = skipped_visible(mask, layout)
    cols = torch.arange(5)
    assert not (skipped & mask).any()
    assert not (skipped & (cols[None, :] >= cols[:, None])[None]).any()
    assert torch.equal(skipped | mask, mask | (cols[None, :] < cols[:, None])[None])


@pytest.mark.parametrize("impl", [mean_token_attention_reference, mean_token_attention_triton])
def test_mean_token_attention_matches_a_loop_over_queries_with_cached_prefixes(impl) -> None:
    prefix, extend, heads, head_dim = [40, 0, 70], [100, 77, 5], (6, 2), 16
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, 4, heads[1], head_dim, dtype=torch.float32, seed=6)
    layout = BlockLayout.build(prefix, extend, BLOCK)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = torch.randn(layout.num_tokens, heads[0], head_dim)
    gen = torch.Generator().manual_seed(7)
    skipped = skipped_visible(
        torch.rand(heads[1], layout.num_rows, layout.max_key_blocks, generator=gen) < 0.5, layout
    )
    k_mean, v_mean = block_means(pool.k, pool.v, layout, locs)
    out, lse = impl(q, k_mean, v_mean, skipped, layout, 0.5)
    group = heads[0] // heads[1]
    for r in range(layout.num_rows):
        offset = int(layout.req_key_offset[layout.row_req[r]])
        for t in range(int(layout.row_q_start[r]), int(layout.row_q_start[r] + layout.row_q_len[r])):
            for head in range(heads[0]):
                cols = skipped[head // group, r].nonzero().flatten()
                keys = offset + cols
                s = 0.5 * k_mean[keys, head // group] @ q[t, head] + layout.key_len[keys].float().log()
                want_lse = torch.logsumexp(s, 0) if len(cols) else torch.tensor(float("-inf"))
                want = (
                    torch.softmax(s, 0) @ v_mean[keys, head // group] if len(cols) else torch.zeros(head_dim)
                )
                torch.testing.assert_close(lse[t, head], want_lse, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out[t, head], want, atol=1e-5, rtol=1e-5)
