"""Sparse vs dense long prefill attention on one GPU: times incl. scoring and planning, TFLOP/s, needles.

    python -m bench.ops.ops_bench [--lens 8192 32768 65536 131072] [--backends auto fa2] [--json PATH]
        [--heads HQ HKV] [--per-query-head] [--chunk-only] [--densities 1 0.1 0.05]

Shape: one request, 32 query / 8 KV heads, head_dim 128, bf16, causal; KV in a page-size-1 pool.
Rows per length L:
  sdpa      torch SDPA, dense causal (GQA)
  fi_dense  FlashInfer ragged prefill, dense causal (what SGLang runs for a fresh prompt)
  sparse_S  this package with scorer S (sampled: exact sampled query rows, block mass, coverage; pooled:
            mean Q . mean K, relative threshold; antidiagonal: strided antidiagonal sums, coverage;
            with --per-query-head one selection per query head): score (Triton) + plan (GPU indices, FlashInfer planner)
            + attention, with the index building alone timed alongside (indices_ms), on synthetic topic-structured Q/K with planted needles, half of them a
            single key token (density is a property of this data); shared_ms counts select + plan once
            per 30 layers, as with --prefill-ext-sparse-per-layer off
  rand_d_B  attention only over a random block mask of density d (--densities; diagonal kept; per query head
            with --per-query-head), FlashInfer backend B (fa2 / fa3, --backends): kernel speed vs density;
            rand_d_antidiagonal_plan_once: the layer as the server runs it at a real model's density d, the
            antidiagonal selection's time + device indices into a reused plan + attention
  chunk     the last 8K chunk of the longest length (each length with --chunk-only) over its cached prefix: sparse (each scorer) vs FlashInfer paged dense
            prefill; `_plan_once`: the antidiagonal mask through one reusable fa2 / fa3 plan made for another
            mask, with device-built indices (plan_ms: no host step), rel_err against a fresh plan; `_mid`:
            the same chunk before the prompt's end (no dense last rows), also over random masks at --densities
TFLOP/s counts the FLOPs each path executes (causal halves included); `ceiling` is a bf16 8K^3 matmul
measured in the same run. Times are medians of CUDA-event timings after a warm-up; the plan-once rows also
give select and plan as the GPU's kernel time alone (torch.profiler) and both as a share of dense.
vs_dense: against FlashInfer's dense kernel (ragged for whole prompts, paged for chunks).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.plan import PlanIndices, build_plan_indices, causal_tokens, device_plan_indices
from sglang_prefill_ext.ops.settings import SCORERS

HQ, HKV, D, BLOCK = 32, 8, 128, 128
TOPICS, TOPIC_AMPLITUDE, NEEDLES, NEEDLE_AMPLITUDE, TOKEN_NEEDLE_AMPLITUDE = 128, 10.0, 16, 12.0, 16.0
SPARSE_LAYERS = 30  # a 32-layer model with --prefill-ext-sparse-dense-layers 2
DEV = "cuda"
PER_QUERY_HEAD = False  # --per-query-head: one selection per query head (mask [HQ, R, C])


def scorer_settings(scorer: str = SparseSettings.scorer) -> SparseSettings:
    """Every plan fresh (`plan_once` off): the rows time a whole plan per call, and the plan-once rows reuse
    a plan explicitly."""
    return SparseSettings(scorer=scorer, per_query_head=PER_QUERY_HEAD, plan_once=False)


def kv_head_mask(mask: torch.Tensor) -> torch.Tensor:
    """A per-query-head mask as its KV heads see it (any of the group keeps a block): [HKV, R, C]."""
    return mask.view(HKV, -1, *mask.shape[1:]).any(1)


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of `fn` over `reps` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gpu_kernels(fn: Callable[[], object], reps: int = 5) -> dict[str, float]:
    """Device milliseconds per run of each of `fn`'s kernels (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {e.key: e.self_device_time_total / reps / 1e3 for e in prof.key_averages()}
    return dict(sorted(((k, v) for k, v in times.items() if v > 0), key=lambda kv: -kv[1]))


def gpu_ms(fn: Callable[[], object], reps: int = 5) -> float:
    """Device milliseconds per run of `fn`'s kernels (their sum): what `fn` costs the GPU when the host
    launches ahead of it, as in a forward whose other layers keep the GPU busy; `timed` also counts the GPU
    waiting for launches."""
    return sum(gpu_kernels(fn, reps).values())


def matmul_ceiling() -> float:
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, 20)
    return 2 * 8192**3 / ms / 1e9


def causal_flops(q_len: int, kv_len: int) -> float:
    """FLOPs of causal attention of q_len queries ending at kv_len keys (QK^T and PV), HQ query heads (read at
    call time: --heads sets it)."""
    pairs = q_len * kv_len - q_len * (q_len - 1) / 2
    return 4.0 * D * HQ * pairs


def plan_flops(indices: PlanIndices, mask_heads: int) -> float:
    qo = indices.qo_indptr.double()
    kv = indices.kv_indptr.double()
    q_len, kv_len = qo[1:] - qo[:-1], kv[1:] - kv[:-1]
    pairs = (q_len * kv_len - q_len * (q_len - 1) / 2).sum().item()
    return 4.0 * D * (HQ // mask_heads) * pairs  # each segment runs HQ / mask_heads query heads


def structured_qkv(
    length: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int, int, str]]]:
    """Q/K with block topics (each query head seeks one topic seen earlier) and planted needles: a
    query block of one head seeks a whole earlier key block, or (every other needle) one key token."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    blocks = length // BLOCK
    topics = F.normalize(torch.randn(TOPICS, D, device=DEV, generator=gen), dim=-1) * TOPIC_AMPLITUDE
    q = torch.randn(length, HQ, D, device=DEV, generator=gen)
    k = torch.randn(length, HKV, D, device=DEV, generator=gen)
    k_topic = torch.randint(0, TOPICS, (blocks, HKV), device=DEV, generator=gen)
    # each query head of block i looks for the topic of one earlier (or its own) key block of its KV head
    earlier = (
        torch.rand(blocks, HQ, device=DEV, generator=gen) * torch.arange(1, blocks + 1, device=DEV)[:, None]
    ).long()
    q_topic = k_topic.repeat_interleave(HQ // HKV, 1).gather(0, earlier)
    q += topics[q_topic].repeat_interleave(BLOCK, 0)
    k += topics[k_topic].repeat_interleave(BLOCK, 0)
    needles = []
    for n in range(NEEDLES):
        qb = int(torch.randint(8, blocks, (1,), device=DEV, generator=gen))
        kb = int(torch.randint(1, qb - 4, (1,), device=DEV, generator=gen))
        qh = int(torch.randint(0, HQ, (1,), device=DEV, generator=gen))
        token = n % 2 == 1  # every other needle is one key token, not a whole key block
        amplitude = TOKEN_NEEDLE_AMPLITUDE if token else NEEDLE_AMPLITUDE
        u = F.normalize(torch.randn(D, device=DEV, generator=gen), dim=0) * amplitude
        q[qb * BLOCK : (qb + 1) * BLOCK, qh] += u
        keys = slice(kb * BLOCK + 37, kb * BLOCK + 38) if token else slice(kb * BLOCK, (kb + 1) * BLOCK)
        k[keys, qh // (HQ // HKV)] += u
        needles.append((qh // (HQ // HKV), qb, kb, "token" if token else "block"))
    v = torch.randn(length, HKV, D, device=DEV, generator=gen)
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), needles


def fi_dense(
    workspace: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> Callable[[], torch.Tensor]:
    from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

    wrapper = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    indptr = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=DEV)
    wrapper.plan(indptr, indptr, HQ, HKV, D, causal=True, q_data_type=q.dtype)
    return lambda: wrapper.run(q, k, v)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], torch.Tensor]:
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    try:
        F.scaled_dot_product_attention(
            qt[:, :, :256], kt[:, :, :256], vt[:, :, :256], is_causal=True, enable_gqa=True
        )
    except RuntimeError:  # no GQA-capable kernel: give SDPA repeated KV heads
        kt, vt = (x.repeat_interleave(HQ // HKV, 1) for x in (kt, vt))
        return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)


def host_ms(fn: Callable[[], object], reps: int = 3) -> float:
    """Wall milliseconds (device synchronised) of code that syncs with the host, e.g. planning."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def plan_times(
    sparse: SparsePrefill, mask: torch.Tensor, q: torch.Tensor, scale: float, locs: torch.Tensor
) -> tuple[float, float]:
    """Wall ms of the index building alone (`build_plan_indices`: the segments' kv_indptr, its read-back,
    the token-index expansion), then of the whole `SparsePrefill.plan` (those indices and
    FlashInfer's planner call); the sparse path is left planned."""
    indices_ms = host_ms(lambda: build_plan_indices(mask, sparse.layout, locs, HKV))
    return indices_ms, host_ms(lambda: sparse.plan(mask, q, scale, num_kv_heads=HKV))


def random_mask(layout: BlockLayout, heads: int, density: float) -> torch.Tensor:
    """Kept blocks [heads, R, C] drawn at `density` over the causal ones, the diagonal always kept."""
    cols = torch.arange(layout.max_key_blocks, device=DEV)[None, :]
    diag = layout.row_block.long()[:, None]
    rand = torch.rand(heads, layout.num_rows, layout.max_key_blocks, device=DEV) < density
    return (rand | (cols == diag)) & (cols <= diag)


def reused_plan(
    mask: torch.Tensor, layout: BlockLayout, q: torch.Tensor, locs: torch.Tensor, workspace: torch.Tensor,
    backend: str = "auto", first_density: float = 0.2,
) -> tuple[BlockSparseAttention, Callable[[], None]]:  # fmt: skip
    """`mask` run as every sparse layer after a forward's first runs it with --prefill-ext-sparse-plan-once:
    through one reusable plan made for another layer's mask (random at `first_density`), with its indices
    built on the device. Returns the planned attention and the index step (no host step), already run."""
    buffer = torch.empty(causal_tokens(layout, mask.shape[0]), dtype=torch.int32, device=DEV)
    once = BlockSparseAttention(torch.empty_like(workspace), backend)
    first = build_plan_indices(random_mask(layout, mask.shape[0], first_density), layout, locs, HKV)
    once.plan(first, HQ, mask.shape[0], D, q.dtype, D**-0.5, reusable=True)

    def indices() -> None:
        once.use_indices(*device_plan_indices(mask, layout, locs, HKV, buffer))

    indices()
    return once, indices


def plan_once_row(
    path: str, L: int, select_ms: float, mask: torch.Tensor, layout: BlockLayout, qkv: tuple, locs: torch.Tensor,
    workspace: torch.Tensor, backend: str = "auto", density: float | None = None,
) -> dict:  # fmt: skip
    """One layer's cost on the plan-once path: `select_ms` (measured by the caller), the device indices of
    `mask` into a reused plan (made for another layer's mask at `density`, default 0.2) and the attention;
    `plan_gpu_ms`: the index step's kernel time alone."""
    q, k, v = qkv
    once, indices = reused_plan(mask, layout, q, locs, workspace, backend, density or 0.2)
    plan_ms = timed(indices, 5)
    attn_ms = timed(lambda: once.run(q, k, v), 5)
    return dict(
        L=L,
        path=path,
        backend=once.backend,
        ms=select_ms + plan_ms + attn_ms,
        select_ms=select_ms,
        plan_ms=plan_ms,
        plan_gpu_ms=gpu_ms(indices),
        attn_ms=attn_ms,
        tflops=plan_flops(build_plan_indices(mask, layout, locs, HKV), mask.shape[0]) / attn_ms / 1e9,
        density=float(mask.sum()) / float((layout.row_block.long() + 1).sum()) / mask.shape[0],
        out=once.run(q, k, v),
    )


def bench_length(
    length: int, ceiling: float, workspace: torch.Tensor, backends: list[str], densities: list[float]
) -> list[dict]:
    reps = 10 if length <= 32768 else 3
    q, k, v, needles = structured_qkv(length, seed=length)
    rows: list[dict] = []
    dense_flops = causal_flops(length, length)

    ms = timed(sdpa(q, k, v), reps)
    rows.append(dict(L=length, path="sdpa", ms=ms, tflops=dense_flops / ms / 1e9))
    fi_run = fi_dense(workspace, q, k, v)
    ms = timed(fi_run, reps)
    dense_out = fi_run()
    rows.append(dict(L=length, path="fi_dense", ms=ms, tflops=dense_flops / ms / 1e9))

    layout = BlockLayout.build([0], [length], BLOCK, DEV)
    locs = torch.arange(length, device=DEV)
    scale = D**-0.5
    causal_blocks = layout.num_rows * (layout.num_rows + 1) / 2
    select_ms = {}
    for scorer in SCORERS:
        sparse = SparsePrefill(scorer_settings(scorer), BlockSparseAttention(workspace, backends[0]))
        sparse.begin(layout, locs)
        select_ms[scorer] = timed(lambda s=sparse: s.select(q, k, scale), reps)
        mask = sparse.select(q, k, scale)
        indices_ms, plan_ms = plan_times(sparse, mask, q, scale, locs)
        indices = build_plan_indices(mask, layout, locs, HKV)
        attn_ms = timed(lambda s=sparse: s.attention.run(q, k, v), reps)
        out = sparse.attention.run(q, k, v)
        total = select_ms[scorer] + plan_ms + attn_ms
        kept = kv_head_mask(mask)
        missed = [n for n in needles if not bool(kept[n[:3]])]
        rows.append(
            dict(
                L=length,
                path=f"sparse_{scorer}",
                backend=sparse.attention.backend,
                ms=total,
                select_ms=select_ms[scorer],
                plan_ms=plan_ms,
                indices_ms=indices_ms,
                attn_ms=attn_ms,
                shared_ms=attn_ms + (select_ms[scorer] + plan_ms) / SPARSE_LAYERS,
                density=float(mask.sum()) / causal_blocks / mask.shape[0],
                recall=1 - len(missed) / len(needles),
                missed=missed,
                rel_err=float((out.float() - dense_out.float()).norm() / dense_out.float().norm()),
                tflops=plan_flops(indices, mask.shape[0]) / attn_ms / 1e9,
                per_layer_overhead=(select_ms[scorer] + plan_ms) / attn_ms,
            )
        )
    mask_heads = HQ if PER_QUERY_HEAD else HKV
    for density in densities:
        if density * causal_tokens(layout, mask_heads) >= 2**31:
            print(
                f"rand_{density}: skipped, its page indices overflow FlashInfer's int32 kv_indptr", flush=True
            )
            continue
        rmask = random_mask(layout, mask_heads, density)
        flops = plan_flops(build_plan_indices(rmask, layout, locs, HKV), mask_heads)
        for backend in backends:
            sparse = SparsePrefill(scorer_settings(), BlockSparseAttention(workspace, backend))
            sparse.begin(layout, locs)
            sparse.plan(rmask, q, scale, num_kv_heads=HKV)
            ms = timed(lambda s=sparse: s.attention.run(q, k, v), reps)
            name = f"rand_{density}_{sparse.attention.backend}"
            rows.append(dict(L=length, path=name, ms=ms, tflops=flops / ms / 1e9, density=density))
        if density < 1:  # at a density a real model selects: the whole plan-once layer, selection included
            row = plan_once_row(
                f"rand_{density}_antidiagonal_plan_once", length, select_ms["antidiagonal"], rmask, layout,
                (q, k, v), locs, workspace, backends[0], density,
            )  # fmt: skip
            del row["out"]
            rows.append(row)
    dense_ms = rows[1]["ms"]
    for row in rows:
        row["vs_dense"] = dense_ms / row["ms"]
        if "shared_ms" in row:
            row["vs_dense_shared"] = dense_ms / row["shared_ms"]
        row["pct_ceiling"] = 100 * row["tflops"] / ceiling
    return rows


def bench_chunk(
    total: int, chunk: int, workspace: torch.Tensor, ceiling: float, densities: list[float]
) -> list[dict]:
    """The last chunk of a long prompt over its cached prefix, as chunked prefill runs it."""
    from flashinfer import BatchPrefillWithPagedKVCacheWrapper

    prefix = total - chunk
    q, k, v, _ = structured_qkv(total, seed=total + 1)
    q_chunk = q[prefix:].contiguous()
    scale = D**-0.5
    paged = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    paged.plan(
        torch.tensor([0, chunk], dtype=torch.int32),
        torch.tensor([0, total], dtype=torch.int32),
        torch.arange(total, dtype=torch.int32, device=DEV),
        torch.ones(1, dtype=torch.int32),
        HQ,
        HKV,
        D,
        1,
        causal=True,
        q_data_type=q.dtype,
    )
    ms = timed(lambda: paged.run(q_chunk, (k.unsqueeze(1), v.unsqueeze(1))), 5)
    rows = [
        dict(
            L=total,
            path=f"chunk{chunk // 1024}K_fi_paged",
            ms=ms,
            tflops=causal_flops(chunk, total) / ms / 1e9,
        )
    ]
    locs = torch.arange(total, device=DEV)
    for scorer in SCORERS:
        sparse = SparsePrefill(scorer_settings(scorer), BlockSparseAttention(workspace))
        layout = BlockLayout.build([prefix], [chunk], BLOCK, DEV)
        sparse.begin(layout, locs)
        select_ms = timed(lambda s=sparse: s.select(q_chunk, k, scale), 5)
        mask = sparse.select(q_chunk, k, scale)
        indices_ms, plan_ms = plan_times(sparse, mask, q_chunk, scale, locs)
        attn_ms = timed(lambda s=sparse: s.attention.run(q_chunk, k, v), 5)
        flops = plan_flops(build_plan_indices(mask, layout, locs, HKV), mask.shape[0])
        rows.append(
            dict(
                L=total,
                path=f"chunk{chunk // 1024}K_{scorer}",
                backend=sparse.attention.backend,
                ms=select_ms + plan_ms + attn_ms,
                select_ms=select_ms,
                plan_ms=plan_ms,
                indices_ms=indices_ms,
                attn_ms=attn_ms,
                tflops=flops / attn_ms / 1e9,
                density=sparse.density(mask),
            )
        )
    rows += plan_once_rows(total, chunk, (q_chunk, k, v), workspace, densities)
    for row in rows:
        row["vs_dense"] = rows[0]["ms"] / row["ms"]  # here: vs FlashInfer paged dense
        row["pct_ceiling"] = 100 * row["tflops"] / ceiling
        if "select_gpu_ms" in row:  # select + plan against the dense attention they replace
            row["overhead_pct"] = 100 * (row["select_ms"] + row["plan_ms"]) / rows[0]["ms"]
            row["overhead_gpu_pct"] = 100 * (row["select_gpu_ms"] + row["plan_gpu_ms"]) / rows[0]["ms"]
    return rows


def plan_once_rows(
    total: int, chunk: int, qkv: tuple, workspace: torch.Tensor, densities: list[float]
) -> list[dict]:
    """The chunk's antidiagonal selection run through one reusable plan (fa2: split-KV off; fa3: its work
    items' KV ranges rewritten) made for another layer's mask, as every sparse layer of a forward after the
    first runs with --prefill-ext-sparse-plan-once: device indices + attention, no host step; rel_err
    against a fresh plan of the same mask says whether the reuse is exact. `_mid`: the same chunk before
    the prompt's end (its last rows selected like the others, not dense over the whole prefix), also with
    random masks at `densities` (a real model's), the antidiagonal selection's time counted."""
    prefix = total - chunk
    q, k, v = qkv
    scale = D**-0.5
    locs = torch.arange(total, device=DEV)
    name = f"chunk{chunk // 1024}K_antidiagonal_plan_once"
    rows = []
    for backend, ends in (("fa2", True), ("fa3", True), ("fa3", False)):
        prompt_lens = torch.tensor([total if ends else total + chunk], device=DEV)
        layout = BlockLayout.build([prefix], [chunk], BLOCK, DEV, prompt_lens=prompt_lens)
        sparse = SparsePrefill(scorer_settings("antidiagonal"), BlockSparseAttention(workspace, backend))
        sparse.begin(layout, locs)
        mask = sparse.select(q, k, scale)
        select_ms = timed(lambda sparse=sparse: sparse.select(q, k, scale), 5)
        kernels = gpu_kernels(lambda sparse=sparse: sparse.select(q, k, scale))
        select_gpu_ms = sum(kernels.values())
        sparse.plan(mask, q, scale, num_kv_heads=HKV)
        fresh = sparse.attention.run(q, k, v)
        row = plan_once_row(
            name + ("" if ends else "_mid"), total, select_ms, mask, layout, qkv, locs, workspace, backend
        )
        out = row.pop("out")
        row["select_gpu_ms"] = select_gpu_ms
        row["select_kernels"] = {name[:60]: round(ms, 3) for name, ms in list(kernels.items())[:8]}
        row["rel_err"] = float((out.float() - fresh.float()).norm() / fresh.float().norm())
        rows.append(row)
        if not ends:
            for density in (d for d in densities if d < 1):
                row = plan_once_row(
                    f"chunk{chunk // 1024}K_rand_{density}_plan_once_mid", total, select_ms,
                    random_mask(layout, mask.shape[0], density), layout, qkv, locs, workspace, backend, density,
                )  # fmt: skip
                del row["out"]
                row["select_gpu_ms"] = select_gpu_ms
                rows.append(row)
    return rows


COLUMNS = (
    "L path backend ms select_ms plan_ms indices_ms select_gpu_ms plan_gpu_ms overhead_pct overhead_gpu_pct "
    "attn_ms per_layer_overhead vs_dense shared_ms vs_dense_shared tflops pct_ceiling density recall rel_err"
)


def table(rows: list[dict], ceiling: float) -> str:
    cols = COLUMNS.split()
    lines = [f"bf16 matmul ceiling: {ceiling:.0f} TFLOP/s (8192^3, same run)", " | ".join(cols)]
    for row in rows:
        cells = []
        for c in cols:
            x = row.get(c, "")
            cells.append(f"{x:.3g}" if isinstance(x, float) and not math.isnan(x) else str(x))
        lines.append(" | ".join(cells))
    for row in rows:
        if "select_kernels" in row:
            kernels = ", ".join(f"{name} {ms:.3g} ms" for name, ms in row["select_kernels"].items())
            lines.append(f"select's kernels, {row['path']} ({row['backend']}): {kernels}")
    lines.append(
        "vs_dense: FlashInfer ragged dense (fi_dense) time / this row's (chunk rows: FlashInfer paged dense)."
    )
    lines.append(
        "per_layer_overhead: (select + plan) / attention, the cost of selecting in every layer, not once; "
        f"shared_ms: attention + (select + plan) / {SPARSE_LAYERS}, one mask (kept blocks) shared by {SPARSE_LAYERS} layers."
    )
    lines.append(
        "plan_ms: indices + direct FlashInfer planner call (what runs); indices_ms: the index building "
        "alone (kv_indptr, its read-back, token-index expansion), the rest of plan_ms is the planner."
    )
    lines.append(
        "*_gpu_ms: the kernels' device time (torch.profiler), without the host's launch time; overhead_pct / "
        "overhead_gpu_pct: select + plan (wall / device) over the chunk's dense FlashInfer time."
    )
    return "\n".join(lines)


def main() -> None:
    global HQ, HKV, PER_QUERY_HEAD
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lens", type=int, nargs="+", default=[8192, 32768, 65536, 131072])
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--backends", nargs="+", default=["auto", "fa2"],
        help="FlashInfer backends of the sparse kernel: the first runs the scored rows, all run the random-mask rows",
    )  # fmt: skip
    parser.add_argument(
        "--heads", type=int, nargs=2, default=[HQ, HKV], metavar=("HQ", "HKV"),
        help="query and KV heads (default the 8B shape; Qwen2.5-Coder-1.5B: 12 2)",
    )  # fmt: skip
    parser.add_argument("--per-query-head", action="store_true", help="scored rows select per query head")
    parser.add_argument(
        "--chunk-only", action="store_true", help="only the chunk rows, over each --lens (else the longest)"
    )
    parser.add_argument(
        "--densities", type=float, nargs="+", default=[1.0, 0.1, 0.05],
        help="densities of the random-mask rows (per query head with --per-query-head)",
    )  # fmt: skip
    args = parser.parse_args()
    HQ, HKV = args.heads
    PER_QUERY_HEAD = args.per_query_head
    torch.manual_seed(0)
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)
    ceiling = matmul_ceiling()
    rows: list[dict] = []
    for length in [] if args.chunk_only else args.lens:
        rows += bench_length(length, ceiling, workspace, args.backends, args.densities)
        print(json.dumps([r for r in rows if r["L"] == length]), flush=True)
        torch.cuda.empty_cache()
    for length in args.lens if args.chunk_only else [max(args.lens)]:
        rows += bench_chunk(length, args.chunk, workspace, ceiling, args.densities)
        torch.cuda.empty_cache()
    info = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, ceiling_tflops=ceiling, heads=[HQ, HKV],
        per_query_head=PER_QUERY_HEAD, rows=rows,
    )  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(info, indent=1))
    print(table(rows, ceiling))


if __name__ == "__main__":
    main()
