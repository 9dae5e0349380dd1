"""Launch tuning of the two block scorers' Triton kernels at one length (issue 6), on the GPU.

    python -m bench.ops.select_sweep [--length 131072] [--json PATH]

On ops_bench's synthetic Q/K (32 q / 8 KV heads, head_dim 128, bf16): the sampled scorer's block
mass (`block_mass_triton`: rows per program x key blocks per program x warps) and the pooled scorer's
selection kernel (`select_pooled_triton`: key blocks per step x warps), each config checked against
the default config's output; plus the parts around them (query/key pooling, the mass epilogue's torch
ops). Median CUDA-event milliseconds after a warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from bench.ops.ops_bench import BLOCK, DEV, D, structured_qkv, timed
from sglang_prefill_ext.ops import BlockLayout, SparseSettings
from sglang_prefill_ext.ops.scorers.pooled import key_segments, pool_keys, pool_queries, select_pooled_triton
from sglang_prefill_ext.ops.scorers.sampled import block_mass_triton


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

    def sweep(op: str, run, want: torch.Tensor, configs: list[dict]) -> None:
        """Time `run(**config)` per config; a config the compiler rejects (e.g. out of shared memory)
        is recorded with its error."""
        for kw in configs:
            try:
                got = run(**kw)
                ms = timed(lambda kw=kw: run(**kw), 5)
            except Exception as err:  # noqa: BLE001 - any compile/launch failure of one config
                rows.append(dict(op=op, **kw, error=str(err).splitlines()[0][:120]))
                continue
            rows.append(dict(op=op, **kw, ms=ms, differs=float((got.float() - want.float()).abs().max())))
            print(json.dumps(rows[-1]), flush=True)

    def mass(**kw):
        return block_mass_triton(q, k, locs, layout, settings.samples, scale, **kw)

    grid = itertools.product((64, 128, 256), (16, 32, 64), (4, 8))
    configs = [dict(tile_rows=t, chunk_cols=c, num_warps=w) for t, c, w in grid]
    sweep("sampled_mass", mass, mass(), configs)
    lse = torch.randn(8, layout.num_rows, layout.max_key_blocks, 8, device=DEV)
    epilogue_ms = timed(lambda: torch.exp(lse - lse.logsumexp(2, keepdim=True)).mean(3), 5)
    rows.append(dict(op="sampled_epilogue_torch", ms=epilogue_ms))
    rows.append(dict(op="pool_queries", ms=timed(lambda: pool_queries(q, layout), 5)))
    rows.append(dict(op="pool_keys", ms=timed(lambda: pool_keys(k, key_segments(layout, locs)), 5)))
    qpool, kpool = pool_queries(q, layout), pool_keys(k, key_segments(layout, locs))

    def select(**kw):
        return select_pooled_triton(qpool, kpool, layout, settings, scale, **kw)

    configs = [dict(block_cols=c, num_warps=w) for c, w in itertools.product((32, 64, 128, 256), (2, 4, 8))]
    sweep("pooled_select", select, select(), configs)
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
