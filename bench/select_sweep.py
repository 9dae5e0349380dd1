"""Launch tuning of the two block scorers' Triton kernels at one length (issue 6), on the GPU.

    python bench/select_sweep.py [--length 131072] [--json PATH]

On ops_bench's synthetic Q/K (32 q / 8 KV heads, head_dim 128, bf16): the sampled scorer's block
mass (`block_mass_triton`: rows per program x key blocks per program x warps) and the pooled scorer's
selection kernel (`select_blocks_triton`: key blocks per step x warps), each config checked against
the default config's output; plus the parts around them (query/key pooling, the mass epilogue's torch
ops). Median CUDA-event milliseconds after a warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
from ops_bench import BLOCK, DEV, D, structured_qkv, timed

from sglang_prefill_ext.ops import BlockLayout, SparseSettings
from sglang_prefill_ext.ops.pooling import key_segments, pool_keys, pool_queries
from sglang_prefill_ext.ops.sampled import block_mass_triton
from sglang_prefill_ext.ops.scoring import select_blocks_triton


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=131072)
    parser.add_argument("--json", type=Path, default=None)
    a = parser.parse_args()
    q, k, _, _ = structured_qkv(a.length, seed=a.length)
    layout = BlockLayout.build([0], [a.length], BLOCK, DEV)
    locs = torch.arange(a.length, device=DEV)
    scale = D**-0.5
    settings = SparseSettings()
    rows = []
    want = block_mass_triton(q, k, locs, layout, settings.samples, scale)
    for tile_rows, chunk_cols, warps in itertools.product((64, 128, 256), (16, 32, 64), (4, 8)):
        kw = dict(tile_rows=tile_rows, chunk_cols=chunk_cols, num_warps=warps)
        try:
            got = block_mass_triton(q, k, locs, layout, settings.samples, scale, **kw)
            ms = timed(lambda kw=kw: block_mass_triton(q, k, locs, layout, settings.samples, scale, **kw), 5)
        except Exception as err:  # noqa: BLE001 - a config the compiler rejects (e.g. out of shared memory)
            rows.append(dict(op="sampled_mass", **kw, error=str(err).splitlines()[0][:120]))
            continue
        rows.append(dict(op="sampled_mass", **kw, ms=ms, max_diff=float((got - want).abs().max())))
        print(json.dumps(rows[-1]), flush=True)
    lse = torch.randn(8, layout.num_rows, layout.max_key_blocks, 8, device=DEV)
    epilogue_ms = timed(lambda: torch.exp(lse - lse.logsumexp(2, keepdim=True)).mean(3), 5)
    rows.append(dict(op="sampled_epilogue_torch", ms=epilogue_ms))
    qpool_ms = timed(lambda: pool_queries(q, layout), 5)
    kpool_ms = timed(lambda: pool_keys(k, key_segments(layout, locs)), 5)
    rows.append(dict(op="pool_queries", ms=qpool_ms))
    rows.append(dict(op="pool_keys", ms=kpool_ms))
    qpool, kpool = pool_queries(q, layout), pool_keys(k, key_segments(layout, locs))
    want_mask = select_blocks_triton(qpool, kpool, layout, settings, scale)
    for block_cols, warps in itertools.product((32, 64, 128, 256), (2, 4, 8)):
        kw = dict(block_cols=block_cols, num_warps=warps)
        got = select_blocks_triton(qpool, kpool, layout, settings, scale, **kw)
        ms = timed(lambda kw=kw: select_blocks_triton(qpool, kpool, layout, settings, scale, **kw), 5)
        rows.append(dict(op="pooled_select", **kw, ms=ms, mismatches=int((got != want_mask).sum())))
        print(json.dumps(rows[-1]), flush=True)
    info = dict(device=torch.cuda.get_device_name(), length=a.length, rows=rows)
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))
    for op in ("sampled_mass", "pooled_select"):
        ok = [r for r in rows if r["op"] == op and "ms" in r]
        best = min(ok, key=lambda r: r["ms"])
        print(f"{op}: best {best}")
    for r in rows:
        if r["op"] in ("sampled_epilogue_torch", "pool_queries", "pool_keys"):
            print(f"{r['op']}: {r['ms']:.3f} ms")


if __name__ == "__main__":
    main()
