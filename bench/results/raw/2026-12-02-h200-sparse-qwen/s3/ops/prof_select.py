"""Ad-hoc: where the antidiagonal selection's time goes, Qwen shape, last 8K chunk over a 120K prefix."""

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_prefill_ext.ops import BlockLayout, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.plan import causal_tokens, device_plan_indices

total, chunk, hq, hkv, d = 131072, 8192, 12, 2, 128
prefix = total - chunk
q = torch.randn(chunk, hq, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16)
locs = torch.arange(total, device="cuda")
layout = BlockLayout.build([prefix], [chunk], 128, "cuda")
for stride in (16, 32):
    sp = SparsePrefill(SparseSettings(stride=stride), None)
    sp.begin(layout, locs)
    for _ in range(3):
        mask = sp.select(q, k, d**-0.5)
    buf = torch.empty(causal_tokens(layout, hq), dtype=torch.int32, device="cuda")
    for _ in range(3):
        device_plan_indices(mask, layout, locs, hkv, buf)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            mask = sp.select(q, k, d**-0.5)
            device_plan_indices(mask, layout, locs, hkv, buf)
        torch.cuda.synchronize()
    print(f"=== stride {stride}: 5 x (select + device_plan_indices)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        sp.select(q, k, d**-0.5)
    e.record()
    torch.cuda.synchronize()
    sel = s.elapsed_time(e) / 10
    s.record()
    for _ in range(10):
        device_plan_indices(mask, layout, locs, hkv, buf)
    e.record()
    torch.cuda.synchronize()
    print(f"stride {stride}: select {sel:.3f} ms, device indices {s.elapsed_time(e) / 10:.3f} ms")
