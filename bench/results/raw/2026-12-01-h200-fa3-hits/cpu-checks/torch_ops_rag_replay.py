"""Every torch operator the scheduler path runs (tree, runner, SGLang's own batch preparation and result
handling) during 100 rag-shaped requests (4 cached 16K documents + 100-token questions, 32 output tokens,
bench/schedule_replay.py's ReplayScheduler with overlap), stock vs ext. On the GPU each is a kernel launch
or, for `_local_scalar_dense` (`.item()`), a device sync: equal counts mean the extension adds no device
work and no sync on this path.

From the repo root, with the venv's SGLang patched (make apply):
    .venv-0.5.17/bin/python bench/results/raw/2026-12-01-h200-fa3-hits/cpu-checks/torch_ops_rag_replay.py
"""

import collections
import random
import sys

from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, "bench")
from schedule_replay import ReplayConfig, ReplayScheduler, TraceReq  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def ops(ext: bool) -> collections.Counter[str]:
    replay = ReplayScheduler(ReplayConfig(ext=ext, chunked_prefill_size=8192, overlap=True))
    rng = random.Random(0)
    docs = [[rng.randrange(1000, 100000) for _ in range(16384)] for _ in range(4)]
    for d, doc in enumerate(docs):
        replay.add(TraceReq(rid=f"d{d}", tokens=tuple(doc), max_new_tokens=1))
        while replay.busy():
            replay.step()
    counter = CountOps()
    with counter:
        for i in range(100):
            question = [rng.randrange(1000, 100000) for _ in range(100)]
            replay.add(TraceReq(rid=f"r{i}", tokens=tuple(docs[i % 4] + question), max_new_tokens=32))
            for _ in range(3):
                if replay.busy():
                    replay.step()
        while replay.busy():
            replay.step()
    return counter.counts


stock, ext = ops(False), ops(True)
print("operator | stock | ext")
for name in sorted(set(stock) | set(ext), key=lambda k: -(stock[k] + ext[k])):
    print(f"{name} | {stock[name]} | {ext[name]}")
print(f"total | {sum(stock.values())} | {sum(ext.values())}")
