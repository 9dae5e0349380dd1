"""Three checks on the scheduler path of rag-shaped requests (4 cached 16K documents + 100-token questions,
32 output tokens; bench/replay/schedule_replay.py's ReplayScheduler with overlap), stock vs ext:

- gc: Python GC collections ({generation: (count, total ms)}) over 200 requests, gc frozen first as SGLang
  does;
- cpu: process CPU seconds of the whole 200-request replay (scheduler, tree, runner, result handling),
  two rounds, stock and ext alternating;
- ops: every torch operator over 100 requests (tree, runner, SGLang's own batch preparation and result
  handling). On the GPU each is a kernel launch or, for `_local_scalar_dense` (`.item()`), a device sync:
  equal counts mean the extension adds no device work and no sync on this path.

From the repo root, with the venv's SGLang patched (make apply):
    .venv-0.5.17/bin/python bench/results/raw/2026-12-01-h200-fa3-hits/cpu-checks/rag_replay_checks.py
"""

import collections
import contextlib
import gc
import random
import sys
import time
from collections.abc import Iterator

from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, ".")  # run from the repository root
from bench.replay.schedule_replay import ReplayConfig, ReplayScheduler, TraceReq  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def gc_times() -> Iterator[dict[int, list]]:
    gc.collect()
    gc.freeze()
    stats: dict[int, list] = {g: [0, 0.0] for g in range(3)}
    began = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            stats[info["generation"]][0] += 1
            stats[info["generation"]][1] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)
    try:
        yield stats
    finally:
        gc.callbacks.remove(on_gc)
        gc.unfreeze()


def rag(ext: bool, requests: int, measure: contextlib.AbstractContextManager) -> None:
    """`requests` questions over cached documents, arriving one per three scheduler iterations, under `measure`."""
    replay = ReplayScheduler(ReplayConfig(ext=ext, chunked_prefill_size=8192, overlap=True))
    rng = random.Random(0)
    docs = [[rng.randrange(1000, 100000) for _ in range(16384)] for _ in range(4)]
    for d, doc in enumerate(docs):
        replay.add(TraceReq(rid=f"d{d}", tokens=tuple(doc), max_new_tokens=1))
        while replay.busy():
            replay.step()
    with measure:
        for i in range(requests):
            question = [rng.randrange(1000, 100000) for _ in range(100)]
            replay.add(TraceReq(rid=f"r{i}", tokens=tuple(docs[i % 4] + question), max_new_tokens=32))
            for _ in range(3):
                if replay.busy():
                    replay.step()
        while replay.busy():
            replay.step()


for ext in (False, True):
    with gc_times() as stats:
        rag(ext, 200, contextlib.nullcontext())
    print("gc", "ext" if ext else "stock", {g: (n, round(1e3 * s, 2)) for g, (n, s) in stats.items()})

for _ in range(2):
    for ext in (False, True):
        began = time.process_time()
        rag(ext, 200, contextlib.nullcontext())
        print("cpu", "ext" if ext else "stock", f"{time.process_time() - began:.3f} s")

counted = {}
for ext in (False, True):
    counted[ext] = CountOps()
    rag(ext, 100, counted[ext])
stock, ext = counted[False].counts, counted[True].counts
print("operator | stock | ext")
for name in sorted(set(stock) | set(ext), key=lambda k: -(stock[k] + ext[k])):
    print(f"{name} | {stock[name]} | {ext[name]}")
print(f"total | {sum(stock.values())} | {sum(ext.values())}")
