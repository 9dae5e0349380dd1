"""Shared-prefix cascade vs stock paged prefill attention on one GPU (issue 7), one layer's attention.

    python bench/cascade_bench.py [--shapes 16x512x32768 32x256x65536 8x1024x16384] [--json PATH]

A shape BxNxS is B requests of N new tokens each, all over the same cached S-token prefix (the
16-request 32K burst: 16x512x32768). Shape of the heads: 32 query / 8 KV heads, head_dim 128, bf16;
KV in a page-size-1 pool. Paths, per shape:
  stock        what SGLang 0.5.17's FlashInfer backend runs: ragged causal pass of the new tokens over
               themselves + paged pass over each request's prefix (the shared slots, once per request)
               + merge_state
  cascade      ops.cascade.CascadePrefill, shared slots scattered over the pool (paged shared pass)
  cascade_contig  the same with the shared slots one contiguous run (ragged shared pass, no gather)
  fi_multilevel FlashInfer's MultiLevelCascadeAttentionWrapper on the scattered layout (a cross-check)
Each pass is also timed alone; `plan ms` is the per-forward host work of cascade (shared-prefix
search, indices, FlashInfer plans), paid once for all layers. From the pass times the script fits the
constants of `ops.cascade_rule.CascadeCosts` (medians over the shapes) and prints the rule's predicted
speed-up next to the measured one. Times are medians of CUDA-event timings after a warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from ops_bench import host_ms, timed

from sglang_prefill_ext.ops.cascade import CascadePrefill, build_cascade_indices, shared_prefix_len
from sglang_prefill_ext.ops.cascade_rule import CascadeCosts, CascadeShape, choose_cascade, pair_flops

HQ, HKV, D, LAYERS = 32, 8, 128, 32
DEV = "cuda"
REPS = 20


@dataclasses.dataclass
class Batch:
    num_reqs: int
    new: int
    shared: int
    q: torch.Tensor  # [B*N, Hq, D]
    k_new: torch.Tensor  # [B*N, Hkv, D], also written to the pool
    v_new: torch.Tensor
    k_pool: torch.Tensor  # [T, Hkv, D]
    v_pool: torch.Tensor
    req_to_token: torch.Tensor  # [B, S+N] int32
    req_pool_indices: torch.Tensor


def make_batch(num_reqs: int, new: int, shared: int, contiguous: bool, seed: int) -> Batch:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    total = shared + num_reqs * new
    slots = (
        torch.arange(total, device=DEV) if contiguous else torch.randperm(total, device=DEV, generator=gen)
    )
    shared_slots, new_slots = slots[:shared], slots[shared:].view(num_reqs, new)
    req_to_token = torch.cat([shared_slots.expand(num_reqs, shared), new_slots], 1).to(torch.int32)
    k_pool = torch.randn(total, HKV, D, device=DEV, generator=gen).bfloat16()
    v_pool = torch.randn(total, HKV, D, device=DEV, generator=gen).bfloat16()
    flat_new = new_slots.flatten()
    q = torch.randn(num_reqs * new, HQ, D, device=DEV, generator=gen).bfloat16()
    return Batch(
        num_reqs,
        new,
        shared,
        q,
        k_pool[flat_new],
        v_pool[flat_new],
        k_pool,
        v_pool,
        req_to_token,
        torch.arange(num_reqs, device=DEV),
    )


def stock_passes(workspace: torch.Tensor, b: Batch) -> dict[str, Callable[[], object]]:
    """SGLang 0.5.17's extend split: ragged over new tokens, paged over each prefix, merge_state."""
    from flashinfer import (
        BatchPrefillWithPagedKVCacheWrapper,
        BatchPrefillWithRaggedKVCacheWrapper,
        merge_state,
    )

    ragged = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    paged = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    qo = torch.arange(0, (b.num_reqs + 1) * b.new, b.new, dtype=torch.int32)
    kv = torch.arange(0, (b.num_reqs + 1) * b.shared, b.shared, dtype=torch.int32)
    ragged.plan(qo, qo, HQ, HKV, D, causal=True, q_data_type=torch.bfloat16)
    prefix_slots = b.req_to_token[:, : b.shared].flatten()
    ones = torch.ones(b.num_reqs, dtype=torch.int32)
    paged.plan(qo, kv, prefix_slots, ones, HQ, HKV, D, 1, causal=False, q_data_type=torch.bfloat16)
    pages = (b.k_pool.unsqueeze(1), b.v_pool.unsqueeze(1))

    def new_pass():
        return ragged.run(b.q, b.k_new, b.v_new, return_lse=True)

    def prefix_pass():
        return paged.run(b.q, pages, return_lse=True)

    parts_new, parts_prefix = new_pass(), prefix_pass()

    def total():
        return merge_state(*new_pass(), *prefix_pass())[0]

    return dict(
        total=total, new=new_pass, prefix=prefix_pass, merge=lambda: merge_state(*parts_new, *parts_prefix)
    )


def plan_cascade(cascade: CascadePrefill, b: Batch) -> None:
    prefix, extend = [b.shared] * b.num_reqs, [b.new] * b.num_reqs
    shared = shared_prefix_len(b.req_to_token, b.req_pool_indices, prefix)
    indices = build_cascade_indices(b.req_to_token, b.req_pool_indices, prefix, extend, shared)
    cascade.plan(indices, HQ, HKV, D, torch.bfloat16, D**-0.5)


def multilevel(workspace: torch.Tensor, b: Batch) -> Callable[[], torch.Tensor]:
    from flashinfer import MultiLevelCascadeAttentionWrapper

    wrapper = MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
    n = b.num_reqs * b.new
    wrapper.plan(
        [torch.tensor([0, n], dtype=torch.int32), torch.arange(0, n + 1, b.new, dtype=torch.int32)],
        [torch.tensor([0, b.shared], dtype=torch.int32), torch.arange(0, n + 1, b.new, dtype=torch.int32)],
        [b.req_to_token[0, : b.shared], b.req_to_token[:, b.shared :].flatten()],
        [torch.ones(1, dtype=torch.int32), torch.ones(b.num_reqs, dtype=torch.int32)],
        HQ,
        HKV,
        D,
        1,
        causal=True,
        q_data_type=torch.bfloat16,
    )
    pages = (b.k_pool.unsqueeze(1), b.v_pool.unsqueeze(1))
    return lambda: wrapper.run(b.q, pages)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def bench_shape(workspace: torch.Tensor, num_reqs: int, new: int, shared: int) -> dict:
    flops = dict(
        prefix=num_reqs * pair_flops(new, shared, False, HQ, D),
        new=num_reqs * pair_flops(new, new, True, HQ, D),
        shared=pair_flops(num_reqs * new, shared, False, HQ, D),
    )
    flops["own"] = flops["new"]  # every request's prefix is the shared one: own context = new tokens
    row: dict = dict(shape=f"{num_reqs}x{new}x{shared}", B=num_reqs, N=new, S=shared)
    b = make_batch(num_reqs, new, shared, contiguous=False, seed=shared + new)
    stock = stock_passes(workspace, b)
    for name, fn in stock.items():
        row[f"stock_{name}_ms"] = timed(fn, REPS)
    ref = stock["total"]()
    for label, contiguous in (("cascade", False), ("cascade_contig", True)):
        bb = b if not contiguous else make_batch(num_reqs, new, shared, contiguous=True, seed=shared + new)
        cascade = CascadePrefill(workspace)
        row[f"{label}_plan_ms"] = host_ms(lambda c=cascade, x=bb: plan_cascade(c, x))
        assert (cascade.indices.shared_start is not None) == contiguous
        row[f"{label}_ms"] = timed(lambda c=cascade, x=bb: c.run(x.q, x.k_pool, x.v_pool), REPS)
        row[f"{label}_shared_ms"] = timed(lambda c=cascade, x=bb: c.run_shared(x.q, x.k_pool, x.v_pool), REPS)
        row[f"{label}_own_ms"] = timed(lambda c=cascade, x=bb: c.run_own(x.q, x.k_pool, x.v_pool), REPS)
        want = ref if not contiguous else stock_passes(workspace, bb)["total"]()
        row[f"{label}_rel_err"] = rel_err(cascade.run(bb.q, bb.k_pool, bb.v_pool), want)
        row[f"{label}_speedup"] = row["stock_total_ms"] / row[f"{label}_ms"]
    ml = multilevel(workspace, b)
    row["fi_multilevel_ms"] = timed(ml, REPS)
    row["fi_multilevel_rel_err"] = rel_err(ml(), ref)
    row["tflops"] = dict(
        stock_prefix=flops["prefix"] / row["stock_prefix_ms"] / 1e9,
        stock_new=flops["new"] / row["stock_new_ms"] / 1e9,
        shared_paged=flops["shared"] / row["cascade_shared_ms"] / 1e9,
        shared_contiguous=flops["shared"] / row["cascade_contig_shared_ms"] / 1e9,
        own=flops["own"] / row["cascade_own_ms"] / 1e9,
        stock_total=(flops["prefix"] + flops["new"]) / row["stock_total_ms"] / 1e9,
    )
    return row


def fit_costs(rows: list[dict]) -> CascadeCosts:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    return CascadeCosts(
        stock_prefix_tflops=med([r["tflops"]["stock_prefix"] for r in rows]),
        stock_new_tflops=med([r["tflops"]["stock_new"] for r in rows]),
        shared_paged_tflops=med([r["tflops"]["shared_paged"] for r in rows]),
        shared_contiguous_tflops=med([r["tflops"]["shared_contiguous"] for r in rows]),
        own_tflops=med([r["tflops"]["own"] for r in rows]),
        pass_us=med([1e3 * r["stock_merge_ms"] for r in rows]),
        plan_ms=med([r["cascade_plan_ms"] for r in rows]),
    )


def table(rows: list[dict], costs: CascadeCosts) -> str:
    lines = [
        "shape BxNxS | stock ms | cascade ms (x) | cascade_contig ms (x) | fi_multilevel ms | plan ms "
        "| stock TFLOP/s | shared pass TFLOP/s paged/contig | rule predicts (paged/contig) | rel err",
    ]
    for r in rows:
        t = r["tflops"]
        predicted = []
        for contiguous in (False, True):
            shape = CascadeShape(r["S"], [r["S"]] * r["B"], [r["N"]] * r["B"], contiguous, HQ, D, LAYERS)
            decision = choose_cascade(shape, 1, 0.0, costs)
            predicted.append(f"{decision.speedup:.2f}x")
        lines.append(
            f"{r['shape']} | {r['stock_total_ms']:.3f} | {r['cascade_ms']:.3f} ({r['cascade_speedup']:.2f}x) "
            f"| {r['cascade_contig_ms']:.3f} ({r['cascade_contig_speedup']:.2f}x) | {r['fi_multilevel_ms']:.3f} "
            f"| {r['cascade_plan_ms']:.2f} | {t['stock_total']:.0f} | {t['shared_paged']:.0f}/{t['shared_contiguous']:.0f} "
            f"| {'/'.join(predicted)} | {r['cascade_rel_err']:.2g}/{r['cascade_contig_rel_err']:.2g}"
        )
    lines.append(
        "x: stock ms / cascade ms, one layer's attention (plan ms, paid once per forward, not included). "
        f"Rule predictions: per forward of {LAYERS} layers, plan included, with the fitted constants."
    )
    lines.append(f"fitted (paste into ops/cascade_rule.py DEFAULT_COSTS): {costs!r}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["16x512x32768", "32x256x65536", "8x1024x16384"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)
    rows = []
    for spec in args.shapes:
        num_reqs, new, shared = (int(x) for x in spec.split("x"))
        rows.append(bench_shape(workspace, num_reqs, new, shared))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    costs = fit_costs(rows)
    if args.json:
        info = dict(
            device=torch.cuda.get_device_name(),
            torch=torch.__version__,
            rows=rows,
            fitted=dataclasses.asdict(costs),
        )
        args.json.write_text(json.dumps(info, indent=1))
    print(table(rows, costs))


if __name__ == "__main__":
    main()
