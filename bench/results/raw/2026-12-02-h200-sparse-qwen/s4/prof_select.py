"""Where the chunk's select and device plan spend their time (Qwen shape 12/2, per query head).

Run on the GPU host from the repo root after `source bench/gpu/stack.sh` (the fourth window's `prof.txt`);
the same code as ran there, its loop body moved into a function.
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

import bench.ops.ops_bench as ob
from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill
from sglang_prefill_ext.ops.plan import causal_tokens, device_plan_indices


def profile_chunk(total: int, chunk: int = 8192) -> None:
    prefix = total - chunk
    q, k, _, _ = ob.structured_qkv(total, seed=3)
    qc = q[prefix:].contiguous()
    locs = torch.arange(total, device="cuda")
    ends = torch.tensor([False], device="cuda")
    layout = BlockLayout.build([prefix], [chunk], 128, "cuda", ends_prompt=ends)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sp = SparsePrefill(ob.scorer_settings("antidiagonal"), BlockSparseAttention(workspace))
    sp.begin(layout, locs)
    scale = 128**-0.5
    buf = torch.empty(causal_tokens(layout, 12), dtype=torch.int32, device="cuda")
    mask = sp.select(qc, k, scale)

    def step() -> None:
        device_plan_indices(sp.select(qc, k, scale), layout, locs, 2, buf)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    select_ms = ob.timed(lambda: sp.select(qc, k, scale), 10)
    indices_ms = ob.timed(lambda: device_plan_indices(mask, layout, locs, 2, buf), 10)
    print(
        f"== {total}: select {select_ms:.3f} ms, indices {indices_ms:.3f} ms, density {sp.density(mask):.4f}"
    )
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
    sys.stdout.flush()


if __name__ == "__main__":
    ob.HQ, ob.HKV, ob.PER_QUERY_HEAD = 12, 2, True
    for length in (131072, 65536):
        profile_chunk(length)
