"""Mask -> FlashInfer indices, and what FlashInfer's causal paged prefill computes over them (emulated)."""

from __future__ import annotations

import types

import pytest
import torch
from kvpool import causal_attention, emulate_paged_prefill, make_pool, request_kv, token_keep_mask

from sglang_prefill_ext.ops.attention import BlockSparseAttention, to_head_major, to_token_major
from sglang_prefill_ext.ops.layout import BlockLayout, context_locs
from sglang_prefill_ext.ops.plan import (
    PlanIndices,
    build_plan_indices,
    causal_tokens,
    device_plan_indices,
)

BLOCK = 16


def _setup(prefix: list[int], extend: list[int], page: int, heads: tuple[int, int], seed: int = 0):
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pool = make_pool(ctx, page, heads[1], 32, dtype=torch.float32, seed=seed)
    layout = BlockLayout.build(prefix, extend, BLOCK)
    locs = context_locs(layout, pool.req_to_token, pool.req_pool_indices)
    q = torch.randn(layout.num_tokens, heads[0], 32, generator=torch.Generator().manual_seed(seed + 1))
    return pool, layout, locs, q


def _random_mask(layout: BlockLayout, num_kv_heads: int, density: float) -> torch.Tensor:
    cols = torch.arange(layout.max_key_blocks)[None, :]
    diag = layout.row_block.long()[:, None]
    keep = (torch.rand(num_kv_heads, layout.num_rows, layout.max_key_blocks) < density) | (cols == diag)
    return keep & (cols <= diag)


def _torch_indices(monkeypatch: pytest.MonkeyPatch, *args) -> PlanIndices:
    """`build_plan_indices` without Triton: `nonzero` and a torch expansion, the reference for the kernel."""
    from sglang_prefill_ext.ops import plan

    with monkeypatch.context() as patched:
        patched.setattr(plan, "triton_enabled", lambda tensor: False)
        return build_plan_indices(*args)


@pytest.mark.parametrize("mask_heads", [2, 8])
@pytest.mark.parametrize(
    ("prefix", "extend", "density"), [([37, 0, 5], [60, 45, 1], 0.5), ([16 * 300 + 3], [40], 0.05)]
)
def test_the_expansion_kernel_builds_the_torch_indices(
    monkeypatch: pytest.MonkeyPatch, mask_heads: int, prefix: list[int], extend: list[int], density: float
) -> None:
    """Also a sparse row wider than the kernel's column tile (256 blocks)."""
    _, layout, locs, _ = _setup(prefix, extend, 4, (8, 2))
    mask = _random_mask(layout, mask_heads, density)
    got = build_plan_indices(mask, layout, locs, 2)
    want = _torch_indices(monkeypatch, mask, layout, locs, 2)
    assert torch.equal(got.kv_indptr, want.kv_indptr) and torch.equal(got.kv_indices, want.kv_indices)
    assert torch.equal(got.qo_indptr, want.qo_indptr)


def test_indices_list_kept_tokens_per_head_and_row_with_the_diagonal_last() -> None:
    pool, layout, locs, _ = _setup([37, 0], [60, 45], 4, (4, 2))
    mask = _random_mask(layout, 2, 0.4)
    indices = build_plan_indices(mask, layout, locs)
    n, rows = layout.num_tokens, layout.num_rows
    assert indices.num_segments == 2 * rows and int(indices.qo_indptr[-1]) == 2 * n
    for h in range(2):
        for r in range(rows):
            s = h * rows + r
            q_lo, q_hi = int(indices.qo_indptr[s]), int(indices.qo_indptr[s + 1])
            assert (q_lo - h * n, q_hi - q_lo) == (int(layout.row_q_start[r]), int(layout.row_q_len[r]))
            got = indices.kv_indices[int(indices.kv_indptr[s]) : int(indices.kv_indptr[s + 1])].long()
            b = int(layout.row_req[r])
            ctx_off = int(layout.req_ctx_offset[b])
            ctx = int(layout.req_ctx_len[b])
            positions = [p for p in range(ctx) if mask[h, r, p // BLOCK]]
            assert got.tolist() == [int(locs[ctx_off + p]) * 2 + h for p in positions]
            assert positions[-1] == min(ctx, (int(layout.row_block[r]) + 1) * BLOCK) - 1


@pytest.mark.parametrize("heads", [3, 12])
def test_head_major_round_trip(heads: int) -> None:
    """Also with one query head per segment (per-query-head masks), where the output must come back
    contiguous: the attention backend views it as [N, Hq x D]."""
    q = torch.randn(10, 12, 8)
    hm = to_head_major(q, heads)
    group = 12 // heads
    assert torch.equal(hm[2 * 10 + 4], q[4, 2 * group : 3 * group])
    back = to_token_major(hm, heads)
    assert torch.equal(back, q) and back.is_contiguous()


CHUNK_CASES = [([0], [100]), ([0, 0, 0], [33, 80, 16]), ([37, 0, 64], [29, 50, 40]), ([200], [1])]


@pytest.mark.parametrize(("prefix", "extend"), CHUNK_CASES)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads", [(8, 2), (7, 1)])
@pytest.mark.parametrize("density", [1.0, 0.3])
@pytest.mark.parametrize("per_query_head", [False, True])
def test_emulated_sparse_prefill_equals_masked_dense_attention(
    prefix: list[int],
    extend: list[int],
    page: int,
    heads: tuple[int, int],
    density: float,
    per_query_head: bool,
) -> None:
    """A mask per KV head (shared by its query heads) or per query head (each its own blocks, reading its
    KV head's pages)."""
    pool, layout, locs, q = _setup(prefix, extend, page, heads)
    mask_heads = heads[0] if per_query_head else heads[1]
    mask = _random_mask(layout, mask_heads, density)
    indices = build_plan_indices(mask, layout, locs, heads[1])
    out = emulate_paged_prefill(to_head_major(q, mask_heads), pool.k, pool.v, indices)
    out = to_token_major(out, mask_heads)
    group = heads[0] // mask_heads
    offset = 0
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        k, v = request_kv(pool, b, p + n)
        rows = (layout.row_req == b).nonzero().flatten()
        keep = token_keep_mask(mask[:, rows], layout.row_block[rows], torch.arange(p, p + n), p + n, BLOCK)
        want = causal_attention(q[offset : offset + n], k, v, keep.repeat_interleave(group, 1))
        torch.testing.assert_close(out[offset : offset + n], want, rtol=1e-4, atol=1e-4)
        offset += n


class _FakeWrapper(types.SimpleNamespace):
    """The parts of FlashInfer's paged prefill wrapper that `BlockSparseAttention` plans through."""

    def __init__(self, backend: str) -> None:
        super().__init__(
            device=torch.device("cpu"),
            _backend=backend,
            is_cuda_graph_enabled=False,
            _kv_lens_buffer=torch.zeros(4, dtype=torch.int32),
            _float_workspace_buffer="float_ws",
            _int_workspace_buffer="int_ws",
            _pin_memory_int_workspace_buffer="pinned_ws",
            public_calls=[],
            module_calls=[],
        )
        self._cached_module = types.SimpleNamespace(
            plan=lambda *args: self.module_calls.append(args) or "info"
        )

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, *args, **kwargs) -> None:
        self.public_calls.append((qo_indptr.tolist(), kv_indptr.tolist(), args, kwargs))


def _attention(backend: str = "fa2") -> BlockSparseAttention:
    attention = BlockSparseAttention.__new__(BlockSparseAttention)
    attention._wrapper = _FakeWrapper(backend)
    attention._num_kv_heads = 0
    attention._signature = None
    attention._reusable = False
    attention._works = None
    return attention


def test_direct_plan_passes_the_planner_what_the_wrapper_would(flashinfer_version: list[str]) -> None:
    _, layout, locs, _ = _setup([37, 0], [60, 45], 1, (8, 2))
    indices = build_plan_indices(_random_mask(layout, 2, 0.5), layout, locs)
    attention = _attention()
    attention.plan(indices, 8, 2, 32, torch.bfloat16, 0.125)
    wrapper = attention._wrapper
    # the one-segment public plan sets the kernel up: 4 query heads per segment, 1 KV head, head_dim 32
    assert wrapper.public_calls == [([0, 1], [0, 1], (4, 1, 32, 1), wrapper.public_calls[0][3])]
    assert wrapper.public_calls[0][3]["sm_scale"] == 0.125 and wrapper.public_calls[0][3]["causal"]
    (args,) = wrapper.module_calls
    kv_lens = indices.kv_indptr[1:] - indices.kv_indptr[:-1]
    q_lens = indices.qo_indptr[1:] - indices.qo_indptr[:-1]
    segments, rows = indices.num_segments, int(indices.qo_indptr[-1])
    assert args[:3] == ("float_ws", "int_ws", "pinned_ws")
    assert torch.equal(args[3], indices.qo_indptr) and torch.equal(args[4], indices.kv_indptr)
    assert torch.equal(args[5], kv_lens)
    assert args[6:] == (rows, segments, 4, 1, 1, False, 32, 32, True, -1, -1, False, 0)
    assert (wrapper._batch_size, wrapper._qo_indptr_last) == (segments, rows)
    assert (wrapper._max_q_len, wrapper._max_kv_len) == (int(q_lens.max()), int(kv_lens.max()))
    assert torch.equal(wrapper._kv_lens_buffer[:segments], kv_lens)  # grown from 4 entries
    assert torch.equal(wrapper._paged_kv_last_page_len_buf, torch.ones(segments, dtype=torch.int32))
    assert wrapper._paged_kv_indices_buf is indices.kv_indices and wrapper._plan_info == "info"


def test_public_plan_runs_again_only_when_the_kernel_signature_changes(flashinfer_version: list[str]) -> None:
    one = PlanIndices(torch.tensor([0, 3]), torch.tensor([0, 5]), torch.arange(5, dtype=torch.int32))
    attention = _attention("fa3")
    for scale in (0.1, 0.1, 0.2, 0.2):
        attention.plan(one, 8, 2, 32, torch.bfloat16, scale)
    wrapper = attention._wrapper
    assert len(wrapper.public_calls) == 2 and len(wrapper.module_calls) == 4
    assert len(wrapper.module_calls[0]) == 16  # fa3's planner takes no split-kv arguments
    attention.plan(one, 8, 2, 32, torch.bfloat16, 0.2, fast=False)  # the whole batch, FlashInfer's way
    assert wrapper.public_calls[-1][:2] == ([0, 3], [0, 5]) and len(wrapper.module_calls) == 4


def test_direct_plan_refuses_backends_it_does_not_cover(flashinfer_version: list[str]) -> None:
    one = PlanIndices(torch.tensor([0, 3]), torch.tensor([0, 5]), torch.arange(5, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="trtllm-gen"):
        _attention("trtllm-gen").plan(one, 8, 2, 32, torch.bfloat16, 0.1)


def test_other_flashinfer_plans_through_the_public_plan_with_one_warning(
    flashinfer_version: list[str],
) -> None:
    """The direct planner writes private fields of one FlashInfer version; any other plans each batch
    through FlashInfer's public `plan()` and says so once."""
    flashinfer_version[0] = "0.7.2"
    one = PlanIndices(torch.tensor([0, 3]), torch.tensor([0, 5]), torch.arange(5, dtype=torch.int32))
    attention = _attention("fa3")
    with pytest.warns(RuntimeWarning, match="flashinfer-python 0.7.2, not 0.6.15.post1") as caught:
        for scale in (0.1, 0.2):
            attention.plan(one, 8, 2, 32, torch.bfloat16, scale)
    assert len(caught) == 1
    wrapper = attention._wrapper
    assert [call[:2] for call in wrapper.public_calls] == [([0, 3], [0, 5])] * 2 and not wrapper.module_calls


@pytest.mark.parametrize("triton", [True, False])
@pytest.mark.parametrize("mask_heads", [2, 8])
def test_device_indices_are_the_host_plans_without_a_host_step(
    monkeypatch: pytest.MonkeyPatch, triton: bool, mask_heads: int
) -> None:
    """Per KV head or per query head, prefixes off the block grid; the buffer past the kept tokens is left
    alone; without Triton the torch expansion gives the same."""
    from sglang_prefill_ext.ops import plan

    if not triton:
        monkeypatch.setattr(plan, "triton_enabled", lambda tensor: False)
    _, layout, locs, _ = _setup([37, 0, 5], [60, 45, 1], 4, (8, 2))
    mask = _random_mask(layout, mask_heads, 0.4)
    want = _torch_indices(monkeypatch, mask, layout, locs, 2)
    buffer = torch.full((causal_tokens(layout, mask_heads),), -7, dtype=torch.int32)
    kv_indptr, kv_indices = device_plan_indices(mask, layout, locs, 2, buffer)
    total = int(want.kv_indptr[-1])
    assert kv_indices is buffer and torch.equal(kv_indptr, want.kv_indptr)
    assert torch.equal(kv_indices[:total], want.kv_indices) and bool((kv_indices[total:] == -7).all())
    every = torch.ones_like(mask) & (torch.arange(mask.shape[2])[None, :] <= layout.row_block.long()[:, None])
    assert int(build_plan_indices(every, layout, locs, 2).kv_indptr[-1]) <= causal_tokens(layout, mask_heads)


def test_a_reusable_fa2_plan_has_the_kv_split_off_and_serves_other_indices(
    flashinfer_version: list[str],
) -> None:
    _, layout, locs, _ = _setup([37, 0], [60, 45], 1, (8, 2))
    first, later = _random_mask(layout, 2, 0.3), _random_mask(layout, 2, 0.6)
    attention = _attention("fa2")
    with pytest.raises(RuntimeError, match="reusable=True"):
        attention.use_indices(*device_plan_indices(later, layout, locs))
    attention.plan(build_plan_indices(first, layout, locs), 8, 2, 32, torch.bfloat16, 0.125, reusable=True)
    (args,) = attention._wrapper.module_calls
    assert args[-3:] == (-1, True, 0)  # fa2's planner: no fixed split size, the KV split disabled
    kv_indptr, kv_indices = device_plan_indices(later, layout, locs)
    attention.use_indices(kv_indptr, kv_indices)
    wrapper = attention._wrapper
    assert wrapper._paged_kv_indptr_buf is kv_indptr and wrapper._paged_kv_indices_buf is kv_indices
    segments = kv_indptr.numel() - 1
    assert torch.equal(wrapper._kv_lens_buffer[:segments], kv_indptr[1:] - kv_indptr[:-1])


def _fake_fa3_planner(wrapper: _FakeWrapper, num_ctas: int) -> None:
    """FlashInfer 0.6.15.post1's PrefillSM90Plan as far as `Fa3Works` reads it: one work item per
    (segment, query head) — query tiles of 128 rows, segments here are shorter — dealt round-robin to
    `num_ctas` work lists, its arrays written at 16-byte-aligned offsets of the page-locked buffer and
    copied to the int workspace."""

    def plan(*args) -> list[int]:
        qo_indptr, kv_indptr, heads = args[3], args[4], args[8]
        works = [(h, s) for h in range(heads) for s in range(qo_indptr.numel() - 1)]
        per_cta = [works[c::num_ctas] for c in range(num_ctas)]
        flat = [w for cta in per_cta for w in cta]
        arrays = {
            "kv_start": [int(kv_indptr[s]) for _, s in flat],
            "kv_len": [int(kv_indptr[s + 1] - kv_indptr[s]) for _, s in flat],
            "work_indptr": [0] + torch.cumsum(torch.tensor([len(c) for c in per_cta]), 0).tolist(),
            "segment": [s for _, s in flat],
        }
        offsets, at = {}, 64  # arrays Fa3Works does not read come first
        pinned = wrapper._pin_memory_int_workspace_buffer
        for name, values in arrays.items():
            offsets[name] = at
            pinned[at : at + 4 * len(values)].view(torch.int32)[:] = torch.tensor(values, dtype=torch.int32)
            at += -(-4 * len(values) // 16) * 16
        wrapper._int_workspace_buffer.copy_(pinned)
        wrapper.module_calls.append(args)
        info = [0] * 9  # PrefillPlanSM90Info.ToVector(): the offsets Fa3Works reads at 2, 4, 6, 7
        info[2], info[4], info[6], info[7] = (
            offsets[n] for n in ("kv_start", "kv_len", "work_indptr", "segment")
        )
        return info

    wrapper._cached_module = types.SimpleNamespace(plan=plan)
    wrapper._pin_memory_int_workspace_buffer = torch.zeros(1 << 16, dtype=torch.uint8)
    wrapper._int_workspace_buffer = torch.zeros(1 << 16, dtype=torch.uint8)


@pytest.mark.parametrize("mask_heads", [2, 8])
def test_a_reusable_fa3_plan_points_its_work_items_at_other_indices(
    flashinfer_version: list[str], monkeypatch: pytest.MonkeyPatch, mask_heads: int
) -> None:
    """fa3's kernel reads each work item's KV start and length from the plan's arrays, never the run's
    kv_indptr: `use_indices` rewrites those arrays in the int workspace, for every work item of every
    query head, from the new device kv_indptr."""
    from sglang_prefill_ext.ops import attention as attention_module

    monkeypatch.setattr(attention_module, "multiprocessors", lambda device: 3)
    _, layout, locs, _ = _setup([37, 0], [60, 45], 1, (8, 2))
    first, later = _random_mask(layout, mask_heads, 0.3), _random_mask(layout, mask_heads, 0.6)
    attention = _attention("fa3")
    _fake_fa3_planner(attention._wrapper, 3)
    attention.plan(build_plan_indices(first, layout, locs, 2), 8, mask_heads, 32, torch.bfloat16, 0.1)
    assert not attention.reusable  # planned to be replaced every layer: nothing kept
    attention.plan(
        build_plan_indices(first, layout, locs, 2), 8, mask_heads, 32, torch.bfloat16, 0.1, reusable=True
    )
    assert attention.reusable and len(attention._wrapper.module_calls[-1]) == 16  # fa3: no split arguments
    kv_indptr, kv_indices = device_plan_indices(later, layout, locs, 2)
    attention.use_indices(kv_indptr, kv_indices)
    wrapper = attention._wrapper
    info = wrapper._plan_info
    ints = wrapper._int_workspace_buffer
    works = attention._works
    total = works.segment.numel()
    assert total == (8 // mask_heads) * (kv_indptr.numel() - 1)  # every (segment, query head)
    segment = ints[info[7] : info[7] + 4 * total].view(torch.int32).long()
    assert torch.equal(works.segment, segment)
    assert torch.equal(ints[info[2] : info[2] + 4 * total].view(torch.int32), kv_indptr[segment])
    kv_len = ints[info[4] : info[4] + 4 * total].view(torch.int32)
    assert torch.equal(kv_len, kv_indptr[segment + 1] - kv_indptr[segment])
    assert wrapper._paged_kv_indices_buf is kv_indices


def test_plan_once_plans_the_first_sparse_layer_and_swaps_indices_after(
    flashinfer_version: list[str],
) -> None:
    """With `plan_once` the forward's first plan is reusable (fa2: the KV split off); a later layer only
    writes its own indices (the host plan's, built on the device); the next forward plans again."""
    from sglang_prefill_ext.ops.policy import SparsePrefill
    from sglang_prefill_ext.ops.settings import SparseSettings

    _, layout, locs, q = _setup([37, 0], [60, 45], 1, (8, 2))
    sparse = SparsePrefill(SparseSettings(block_size=BLOCK, plan_once=True), _attention("fa2"))
    wrapper = sparse.attention._wrapper
    masks = [_random_mask(layout, 8, d) for d in (0.3, 0.6, 0.2)]
    sparse.begin(layout, locs)
    for mask in masks[:2]:
        sparse.plan(mask, q, 0.125, num_kv_heads=2)
    assert len(wrapper.module_calls) == 1 and wrapper.module_calls[0][-2] is True  # disable_split_kv
    want = build_plan_indices(masks[1], layout, locs, 2)
    assert torch.equal(wrapper._paged_kv_indptr_buf, want.kv_indptr)
    total = int(want.kv_indptr[-1])
    assert torch.equal(wrapper._paged_kv_indices_buf[:total], want.kv_indices) and sparse.mask is masks[1]
    sparse.plan(masks[2], q, 0.25, num_kv_heads=2)  # another scale: a plan of its own
    sparse.begin(layout, locs)
    sparse.plan(masks[2], q, 0.25, num_kv_heads=2)
    assert len(wrapper.module_calls) == 3
    sparse.plan(_random_mask(layout, 2, 0.3), q, 0.25, num_kv_heads=2)  # per KV head: other segments, a plan
    assert len(wrapper.module_calls) == 4
    every_layer = SparsePrefill(SparseSettings(block_size=BLOCK, plan_once=False), _attention("fa2"))
    every_layer.begin(layout, locs)
    for mask in masks[:2]:
        every_layer.plan(mask, q, 0.125, num_kv_heads=2)
    assert [call[-2] for call in every_layer.attention._wrapper.module_calls] == [False, False]
    from sglang_prefill_ext.ops import attention

    flashinfer_version[0] = "0.7.2"  # no direct planning: every layer plans through the public plan
    attention.direct_planning_supported.cache_clear()
    other = SparsePrefill(SparseSettings(block_size=BLOCK, plan_once=True), _attention("fa2"))
    other.begin(layout, locs)
    with pytest.warns(RuntimeWarning, match="0.7.2"):
        for mask in masks[:2]:
            other.plan(mask, q, 0.125, num_kv_heads=2)
    assert len(other.attention._wrapper.public_calls) == 2 and not other.attention.reusable
