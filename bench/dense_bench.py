"""Gathered dense prefill vs stock's attention over a whole chunked prefill, one layer (issue 7).

    python bench/dense_bench.py [--lens 8192 32768 65536 131072] [--chunk 8192] [--json PATH]

A prompt of L tokens is prefilled in chunks of `--chunk` tokens; chunk c attends to the c * chunk
cached tokens before it and causally to itself. Per L, summed over the chunks (32 query / 8 KV heads,
head_dim 128, bf16, KV in a page-size-1 pool whose slots are contiguous, as for a fresh prompt on a
fresh server, or a random permutation, as after long uptime):
  stock_graph  SGLang 0.5.17 under a prefill CUDA graph (its default up to --chunked-prefill-size
               tokens): one paged FA2 pass of the chunk over prefix + chunk
  stock_eager  SGLang 0.5.17 without the graph: ragged (auto backend) pass of the chunk over itself +
               paged FA2 pass over the prefix + merge_state
  paged_fa3    with --paged-fa3: one paged pass over prefix + chunk on FlashInfer's FA3 backend (its
               module may need a JIT build the kernel cache lacks, minutes)
  gathered     ops.dense.GatheredPrefill: gather prefix + chunk K/V from the pool, one ragged causal pass
  contiguous   the ragged pass alone over the pool's contiguous slots (the gather's ceiling; contiguous only)
TFLOP/s counts causal attention FLOPs; `ceiling` is a bf16 8K^3 matmul measured in the same run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from ops_bench import causal_flops, matmul_ceiling, timed

from sglang_prefill_ext.ops.dense import GatheredPrefill

HQ, HKV, D = 32, 8, 128
DEV = "cuda"
REPS = 3


def _ind(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def chunk_paths(
    workspace: torch.Tensor,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    locs: torch.Tensor,
    prefix: int,
    contiguous: bool,
    paged_fa3: bool = False,
) -> dict[str, Callable[[], object]]:
    """Runnable attention of one chunk (queries q over `locs`, whose last q.shape[0] are the chunk)."""
    from flashinfer import (
        BatchPrefillWithPagedKVCacheWrapper,
        BatchPrefillWithRaggedKVCacheWrapper,
        merge_state,
    )

    n, total = q.shape[0], locs.numel()
    pages = (k_pool.unsqueeze(1), v_pool.unsqueeze(1))
    kw = dict(q_data_type=q.dtype, kv_data_type=q.dtype)
    paths: dict[str, Callable[[], object]] = {}
    for name, backend in (("stock_graph", "fa2"), ("paged_fa3", "fa3"))[: 1 + paged_fa3]:
        w = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
        w.plan(_ind(0, n), _ind(0, total), locs.int(), _ind(1), HQ, HKV, D, 1, causal=True, **kw)
        paths[name] = lambda w=w: w.run(q, pages)
    k_new, v_new = k_pool[locs[prefix:]], v_pool[locs[prefix:]]
    self_pass = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="auto")
    self_pass.plan(_ind(0, n), _ind(0, n), HQ, HKV, D, causal=True, **kw)
    if prefix:
        prefix_pass = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        prefix_pass.plan(
            _ind(0, n), _ind(0, prefix), locs[:prefix].int(), _ind(1), HQ, HKV, D, 1, causal=False, **kw
        )

        def stock_eager() -> object:
            o1, s1 = self_pass.run(q, k_new, v_new, return_lse=True)
            o2, s2 = prefix_pass.run(q, pages, return_lse=True)
            return merge_state(o1, s1, o2, s2)[0]

        paths["stock_eager"] = stock_eager
    else:
        paths["stock_eager"] = lambda: self_pass.run(q, k_new, v_new)
    gathered = GatheredPrefill(workspace)
    req_to_token = locs.int().unsqueeze(0)
    gathered.plan(
        req_to_token,
        torch.zeros(1, dtype=torch.int64, device=DEV),
        [prefix],
        [n],
        HQ,
        HKV,
        D,
        q.dtype,
        D**-0.5,
    )
    paths["gathered"] = lambda: gathered.run(q, k_pool, v_pool)
    if contiguous:
        start = int(locs[0])
        whole = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="auto")
        whole.plan(_ind(0, n), _ind(0, total), HQ, HKV, D, causal=True, **kw)
        paths["contiguous"] = lambda: whole.run(
            q, k_pool[start : start + total], v_pool[start : start + total]
        )
    return paths


def bench_prompt(
    length: int, chunk: int, contiguous: bool, workspace: torch.Tensor, ceiling: float, paged_fa3: bool
) -> list[dict]:
    gen = torch.Generator(device=DEV).manual_seed(length)
    pool_size = length + 1
    k_pool = torch.randn(pool_size, HKV, D, device=DEV, generator=gen).bfloat16()
    v_pool = torch.randn(pool_size, HKV, D, device=DEV, generator=gen).bfloat16()
    slots = (
        torch.arange(1, pool_size, device=DEV)
        if contiguous
        else torch.randperm(length, device=DEV, generator=gen) + 1
    )
    totals: dict[str, float] = {}
    flops = 0.0
    for prefix in range(0, length, chunk):
        n = min(chunk, length - prefix)
        q = torch.randn(n, HQ, D, device=DEV, generator=gen).bfloat16()
        locs = slots[: prefix + n]
        flops += causal_flops(n, prefix + n)
        for name, fn in chunk_paths(
            workspace, q, k_pool, v_pool, locs, prefix, contiguous, paged_fa3
        ).items():
            totals[name] = totals.get(name, 0.0) + timed(fn, REPS)
    slots_name = "contiguous" if contiguous else "scattered"
    return [
        dict(
            L=length,
            slots=slots_name,
            path=name,
            ms=ms,
            tflops=flops / ms / 1e9,
            pct_ceiling=100 * flops / ms / 1e9 / ceiling,
            vs_stock_graph=totals["stock_graph"] / ms,
            vs_stock_eager=totals["stock_eager"] / ms,
        )
        for name, ms in totals.items()
    ]


def check_outputs(workspace: torch.Tensor) -> float:
    """Largest difference of `gathered` from `stock_eager` on one 8K chunk over a 24K prefix (sanity)."""
    gen = torch.Generator(device=DEV).manual_seed(7)
    k_pool = torch.randn(32769, HKV, D, device=DEV, generator=gen).bfloat16()
    v_pool = torch.randn(32769, HKV, D, device=DEV, generator=gen).bfloat16()
    q = torch.randn(8192, HQ, D, device=DEV, generator=gen).bfloat16()
    locs = torch.randperm(32768, device=DEV, generator=gen) + 1
    paths = chunk_paths(workspace, q, k_pool, v_pool, locs, 24576, contiguous=False)
    return float((paths["gathered"]().float() - paths["stock_eager"]().float()).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lens", type=int, nargs="+", default=[8192, 32768, 65536, 131072])
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--paged-fa3", action="store_true")
    args = parser.parse_args()
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)
    ceiling = matmul_ceiling()
    max_diff = check_outputs(workspace)
    rows: list[dict] = []
    for length in args.lens:
        for contiguous in (True, False):
            rows += bench_prompt(length, args.chunk, contiguous, workspace, ceiling, args.paged_fa3)
            torch.cuda.empty_cache()
    if args.json:
        info = dict(
            device=torch.cuda.get_device_name(),
            torch=torch.__version__,
            ceiling_tflops=ceiling,
            chunk=args.chunk,
            max_abs_diff_vs_stock=max_diff,
            rows=rows,
        )
        args.json.write_text(json.dumps(info, indent=1))
    print(f"bf16 matmul ceiling: {ceiling:.0f} TFLOP/s; gathered vs stock_eager max |diff| {max_diff:.3g}")
    print(
        "L | slots | path | ms (all chunks, one layer) | TFLOP/s | % ceiling | stock_graph/this | stock_eager/this"
    )
    for r in rows:
        print(
            f"{r['L']} | {r['slots']} | {r['path']} | {r['ms']:.2f} | {r['tflops']:.0f} | {r['pct_ceiling']:.0f} | "
            f"{r['vs_stock_graph']:.2f} | {r['vs_stock_eager']:.2f}"
        )


if __name__ == "__main__":
    main()
