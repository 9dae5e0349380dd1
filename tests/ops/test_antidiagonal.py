"""Antidiagonal block mass (XAttention's estimate) against the full logit matrix, and its selection."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kvpool import scattered_batch

from sglang_prefill_ext.ops.layout import BlockLayout
from sglang_prefill_ext.ops.policy import SparsePrefill
from sglang_prefill_ext.ops.scorers import antidiagonal
from sglang_prefill_ext.ops.scorers.antidiagonal import (
    PackedRows,
    antidiagonal_mass,
    block_lse_torch,
    block_lse_triton,
    gather_rows,
    tile_mass_torch,
    tile_mass_triton,
)
from sglang_prefill_ext.ops.selection import select_by_mass
from sglang_prefill_ext.ops.settings import SparseSettings

BLOCK = 16


def _batch(heads: tuple[int, int], head_dim: int, prefix: list[int], extend: list[int], seed: int = 0):
    return scattered_batch(heads, head_dim, prefix, extend, BLOCK, seed)


def _reference(q, k_buffer, locs, layout, stride, sm_scale) -> torch.Tensor:
    """From each request's full [Hq, positions, positions] logits at absolute positions (rows without a
    query and keys past the context zero): antidiagonal sums by strided slicing, softmax, tile sums."""
    num_qo_heads = q.shape[1]
    group = num_qo_heads // k_buffer.shape[1]
    out = torch.zeros(num_qo_heads, layout.num_rows, layout.max_key_blocks)
    row = q_off = ctx_off = 0
    for prefix, extend in zip(layout.prefix_lens, layout.extend_lens, strict=True):
        ctx = prefix + extend
        cols = (ctx - 1) // BLOCK + 1
        n = cols * BLOCK
        queries = torch.zeros(n, num_qo_heads, q.shape[2])
        queries[prefix:ctx] = q[q_off : q_off + extend]
        keys = torch.zeros(n, k_buffer.shape[1], q.shape[2])
        keys[:ctx] = k_buffer[locs[ctx_off : ctx_off + ctx]]
        logits = torch.einsum("ihd,jhd->hij", queries, keys.repeat_interleave(group, 1))
        packed = (
            sum(logits[:, stride - 1 - t :: stride, t::stride] for t in range(stride)) * sm_scale / stride
        )
        m = n // stride
        causal = torch.arange(m)[None, :] <= torch.arange(m)[:, None]
        p = packed.masked_fill(~causal, float("-inf")).softmax(-1)
        has_query = ((torch.arange(m) + 1) * stride > prefix) & (torch.arange(m) * stride < ctx)
        p = p * has_query[None, :, None]
        tiles = p.view(num_qo_heads, cols, BLOCK // stride, cols, BLOCK // stride).sum((2, 4))
        first = prefix // BLOCK
        out[:, row : row + cols - first, :cols] = tiles[:, first:]
        row += cols - first
        q_off += extend
        ctx_off += ctx
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    ("heads", "head_dim", "stride"),
    [((6, 2), 16, 4), ((4, 4), 16, 8), ((3, 1), 16, 16), ((14, 2), 64, 16)],  # last: Qwen2.5-Coder-0.5B's
)
def test_mass_matches_the_full_logit_matrix(heads: tuple[int, int], head_dim: int, stride: int) -> None:
    """Prefixes that do not end on a block or a packed row, a single-token request, shuffled slots."""
    layout, q, k_buffer, locs = _batch(heads, head_dim, [0, 37, 5, 64], [90, 29, 1, 40])
    per_q = antidiagonal_mass(q, k_buffer, locs, layout, stride, 0.3, per_query_head=True)
    torch.testing.assert_close(
        per_q, _reference(q, k_buffer, locs, layout, stride, 0.3), atol=1e-5, rtol=1e-4
    )
    per_kv = antidiagonal_mass(q, k_buffer, locs, layout, stride, 0.3)
    torch.testing.assert_close(per_kv, per_q.view(heads[1], -1, *per_q.shape[1:]).mean(1))
    torch.testing.assert_close(per_kv.sum(-1), torch.ones(heads[1], layout.num_rows))
    after = torch.arange(layout.max_key_blocks)[None, :] > layout.row_block.long()[:, None]
    assert float(per_q[:, after].abs().max()) == 0.0


@pytest.mark.parametrize("per_block", [16, 4, 1])
def test_the_block_lse_kernel_matches_torch(per_block: int) -> None:
    """bf16 scores of 2 KV heads x 3 group members, rows that see part of a block, and packed rows with no
    query (before the prefix ends, past the context: -inf everywhere)."""
    gen = torch.Generator().manual_seed(per_block)
    count = 9
    s = (torch.randn(2 * count * 3, 12 * per_block, generator=gen) * 40).bfloat16()
    rows = PackedRows(
        first=2 * per_block + 1,
        count=count,
        group=3,
        prefix=(2 * per_block + 3) * 4,
        ctx=(2 * per_block + 7) * 4 + 1,
        stride=4,
    )
    want = block_lse_torch(s, rows, per_block, 0.1)
    torch.testing.assert_close(block_lse_triton(s, rows, per_block, 0.1), want, atol=1e-5, rtol=1e-5)
    pos = rows.positions(s.shape[0], "cpu")
    assert sorted(set(pos.tolist()))[:2] == [-1, rows.first + 2] and int(pos.max()) == rows.first + 6
    assert bool(torch.isinf(want[pos == -1]).all()) and bool(torch.isfinite(want[:, 0][pos >= 0]).all())


@pytest.mark.parametrize(("per_block", "num_cols"), [(8, 700), (4, 5), (1, 33)])
def test_the_tile_mass_kernel_matches_torch(per_block: int, num_cols: int) -> None:
    """Block lse of 2 KV heads x 3 group members, rows without a query (all -inf) inside query blocks,
    rows wider than one column tile, written at an offset into a wider mass."""
    gen = torch.Generator().manual_seed(num_cols)
    m = 3 * per_block
    lse = torch.randn(2 * m * 3, num_cols, generator=gen) * 3
    lse[torch.rand(lse.shape, generator=gen) < 0.3] = float("-inf")
    lse[4] = float("-inf")
    got, want = (torch.zeros(6, 7, num_cols + 2) for _ in range(2))
    tile_mass_triton(lse, got, 3, per_block, 2)
    tile_mass_torch(lse, want, 3, per_block, 2)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    live = torch.isfinite(lse).any(-1).view(2, 3, per_block, 3).permute(0, 3, 1, 2).reshape(6, 3, per_block)
    torch.testing.assert_close(got[:, 2:5].sum(-1), live.any(-1).float())  # 1, or 0: no query in the block
    assert bool(live.any(-1).all()) != (per_block == 1)


def test_gather_rows_kernel_matches_indexing_with_zero_rows() -> None:
    src = torch.randn(50, 24)  # a row width that is not a power of two
    index = torch.tensor([3, -1, 49, 0, 3, -1, 17] * 20)
    want = torch.where((index >= 0)[:, None], src[index.clamp_min(0)], 0)
    assert torch.equal(gather_rows(src, index), want)


def test_without_triton_the_torch_path_gives_the_same_mass(monkeypatch: pytest.MonkeyPatch) -> None:
    layout, q, k_buffer, locs = _batch((6, 2), 16, [0, 37, 64], [90, 29, 40], seed=2)
    want = antidiagonal_mass(q, k_buffer, locs, layout, 4, 0.3, per_query_head=True)
    monkeypatch.setattr(antidiagonal, "triton_enabled", lambda tensor: False)
    torch.testing.assert_close(
        antidiagonal_mass(q, k_buffer, locs, layout, 4, 0.3, per_query_head=True), want
    )


def test_rows_processed_in_steps_give_the_same_mass(monkeypatch: pytest.MonkeyPatch) -> None:
    layout, q, k_buffer, locs = _batch((4, 2), 16, [40], [300], seed=1)
    whole = antidiagonal_mass(q, k_buffer, locs, layout, 4, 0.25, per_query_head=True)
    monkeypatch.setattr(antidiagonal, "SCORE_BYTES", 1)  # one query block per step
    torch.testing.assert_close(
        antidiagonal_mass(q, k_buffer, locs, layout, 4, 0.25, per_query_head=True), whole
    )


def test_a_key_every_query_of_one_head_reads_is_kept_for_that_head_only() -> None:
    """A single key token (a vertical line) sought by every row of query head 4: every antidiagonal
    crossing it sees it, so its block is kept for head 4 in every row, not so for head 0."""
    layout, q, k_buffer, locs = _batch((6, 2), 32, [16 * 40], [16 * 8], seed=3)
    needle = torch.randn(32)
    needle = 12.0 * needle / needle.norm()
    key_block, q_head = 9, 4  # query head 4 belongs to KV head 1
    q[:, q_head] += needle
    k_buffer[locs[key_block * BLOCK + 5], 1] += needle
    settings = SparseSettings(
        block_size=BLOCK, scorer="antidiagonal", stride=4, mass=0.5, per_query_head=True
    )
    sparse = SparsePrefill(settings, None)
    sparse.begin(layout, locs)
    keep = sparse.select(q, k_buffer, 32**-0.5)
    assert bool(keep[q_head, :, key_block].all())
    assert not bool(keep[0, :, key_block].all())
    want = select_by_mass(antidiagonal_mass(q, k_buffer, locs, layout, 4, 32**-0.5, True), layout, settings)
    assert torch.equal(keep, want)


def test_stride_must_divide_the_block_for_this_scorer() -> None:
    with pytest.raises(ValueError, match="stride 32 must divide block_size 16"):
        SparseSettings(block_size=16, scorer="antidiagonal", stride=32)
    with pytest.raises(ValueError, match="power of two"):
        SparseSettings(stride=6)
    assert SparseSettings(block_size=16, scorer="pooled", stride=32).stride == 32


@pytest.mark.gpu
def test_bf16_on_cuda_matches_the_fp32_mass() -> None:
    """The serving dtype: bf16 Q/K on the GPU (the matmul in bf16, softmax in fp32) against fp32 on the CPU."""
    layout, q, k_buffer, locs = _batch((12, 2), 128, [300, 0], [1700, 900], seed=4)
    want = antidiagonal_mass(q, k_buffer, locs, layout, 8, 128**-0.5, per_query_head=True)
    gpu = BlockLayout.build(list(layout.prefix_lens), list(layout.extend_lens), BLOCK, "cuda")
    got = antidiagonal_mass(
        q.cuda().bfloat16(), k_buffer.cuda().bfloat16(), locs.cuda(), gpu, 8, 128**-0.5, per_query_head=True
    )
    torch.testing.assert_close(got.cpu(), want, atol=2e-2, rtol=0)


def test_a_layer_named_in_layer_mass_selects_at_its_own_mass() -> None:
    """`layer_mass` 2-3=1: model layers 2 and 3 keep every causal block, layer 1 and an unnamed layer
    select at the base mass, as settings with that mass would."""
    layout, q, k_buffer, locs = _batch((6, 2), 32, [16 * 40], [16 * 8], seed=5)
    base = SparseSettings(block_size=BLOCK, scorer="antidiagonal", stride=4, mass=0.5, per_query_head=True)
    sparse = SparsePrefill(dataclasses.replace(base, layer_mass="2-3=1,5-5=0.8"), None)
    sparse.begin(layout, locs)
    causal = select_by_mass(
        antidiagonal_mass(q, k_buffer, locs, layout, 4, 32**-0.5, True),
        layout,
        dataclasses.replace(base, mass=1.0),
    )
    for layer in (2, 3):
        assert torch.equal(sparse.select(q, k_buffer, 32**-0.5, layer), causal)
    at_base = sparse.select(q, k_buffer, 32**-0.5, 1)
    plain = SparsePrefill(base, None)
    plain.begin(layout, locs)
    assert torch.equal(at_base, plain.select(q, k_buffer, 32**-0.5))
    assert int(at_base.sum()) < int(causal.sum())
    assert sparse.settings.at_layer(5).mass == 0.8 and sparse.settings.at_layer(4).mass == 0.5


@pytest.mark.parametrize(
    ("text", "message"),
    [("7-20", "expected A-B=V"), ("7=0.9", "expected A-B=V"), ("a-b=0.9", "expected A-B=V"), ("9-7=0.9", "0 <= A <= B"),
     ("1-2=1.5", "mass in"), ("0-9=0.9,9-12=0.95", "overlaps")],
)  # fmt: skip
def test_a_malformed_layer_mass_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SparseSettings(layer_mass=text)
    with pytest.raises(ValueError, match="needs per_layer"):
        SparseSettings(layer_mass="1-2=0.9", per_layer=False)
    assert SparseSettings(layer_mass="1-2=0.9").at_layer(None) == SparseSettings(layer_mass="1-2=0.9")


def test_a_layer_named_in_layer_stride_selects_at_its_own_stride() -> None:
    """`layer_stride` 2-3=2 over stride 8: model layers 2 and 3 select as settings at stride 2 everywhere
    would, layer 1 and an unnamed layer as the base settings; one packing per stride serves every layer."""
    layout, q, k_buffer, locs = _batch((6, 2), 32, [16 * 40], [16 * 8], seed=6)
    base = SparseSettings(block_size=BLOCK, scorer="antidiagonal", stride=8, mass=0.5, per_query_head=True)
    sparse = SparsePrefill(dataclasses.replace(base, layer_stride="2-3=2"), None)
    sparse.begin(layout, locs)

    def alone(settings: SparseSettings) -> torch.Tensor:
        plain = SparsePrefill(settings, None)
        plain.begin(layout, locs)
        return plain.select(q, k_buffer, 32**-0.5)

    fine, coarse = alone(dataclasses.replace(base, stride=2)), alone(base)
    assert not torch.equal(fine, coarse)  # the strides select differently here
    for layer, want in ((1, coarse), (2, fine), (3, fine), (4, coarse), (2, fine)):
        assert torch.equal(sparse.select(q, k_buffer, 32**-0.5, layer), want)
    assert sorted(sparse._packings) == [2, 8]
    sparse.begin(layout, locs)
    assert sparse._packings == {}


def test_layer_mass_and_layer_stride_apply_together() -> None:
    settings = SparseSettings(stride=16, mass=0.7, layer_mass="7-20=0.95", layer_stride="5-9=4,20-27=8")
    want = {0: (0.7, 16), 6: (0.7, 4), 7: (0.95, 4), 20: (0.95, 8), 27: (0.7, 8), 28: (0.7, 16)}
    at = {layer: settings.at_layer(layer) for layer in want}
    assert {layer: (s.mass, s.stride) for layer, s in at.items()} == want
    assert at[7] == SparseSettings(stride=4, mass=0.95)  # a layer's own settings, no ranges left
    assert settings.at_layer(None) is settings
    assert SparseSettings(stride=16).at_layer(7) == SparseSettings(stride=16)


@pytest.mark.parametrize(
    ("text", "message"),
    [("7-20", "expected A-B=V"), ("7=4", "expected A-B=V"), ("9-7=4", "0 <= A <= B"), ("1-2=3", "power of two"),
     ("1-2=0", "power of two"), ("1-2=x", "power of two"), ("1-2=-4", "power of two"), ("0-9=4,9-12=8", "overlaps"),
     ("1-2=32", "stride 32 must divide block_size 16")],
)  # fmt: skip
def test_a_malformed_layer_stride_is_refused_by_name(text: str, message: str) -> None:
    """Checked as `stride` is: a power of two dividing the block size (the antidiagonal scorer's)."""
    with pytest.raises(ValueError, match=message):
        SparseSettings(block_size=16, stride=4, layer_stride=text)
    with pytest.raises(ValueError, match="layer_stride needs per_layer"):
        SparseSettings(layer_stride="1-2=8", per_layer=False)
    assert SparseSettings(block_size=16, scorer="pooled", layer_stride="1-2=32").layer_stride == "1-2=32"
