"""Where the chunk's select and device plan spend their time (Qwen shape 12/2, per query head)."""
import sys
import torch
from torch.profiler import ProfilerActivity, profile

import bench.ops.ops_bench as ob
from sglang_prefill_ext.ops import BlockLayout, BlockSparseAttention, SparsePrefill
from sglang_prefill_ext.ops.plan import causal_tokens, device_plan_indices

ob.HQ, ob.HKV, ob.PER_QUERY_HEAD = 12, 2, True
for total in (131072, 65536):
    chunk = 8192
    prefix = total - chunk
    q, k, v, _ = ob.structured_qkv(total, seed=3)
    qc = q[prefix:].contiguous()
    locs = torch.arange(total, device="cuda")
    layout = BlockLayout.build([prefix], [chunk], 128, "cuda", ends_prompt=torch.tensor([False], device="cuda"))
    sp = SparsePrefill(ob.scorer_settings("antidiagonal"), BlockSparseAttention(torch.empty(256 << 20, dtype=torch.uint8, device="cuda")))
    sp.begin(layout, locs)
    scale = 128 ** -0.5
    buf = torch.empty(causal_tokens(layout, 12), dtype=torch.int32, device="cuda")
    mask = sp.select(qc, k, scale)
    def step():
        m = sp.select(qc, k, scale)
        device_plan_indices(m, layout, locs, 2, buf)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"== {total}: select {ob.timed(lambda: sp.select(qc, k, scale), 10):.3f} ms, "
          f"indices {ob.timed(lambda: device_plan_indices(mask, layout, locs, 2, buf), 10):.3f} ms, density {sp.density(mask):.4f}")
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
    sys.stdout.flush()
