"""Python GC collections ({generation: (count, total ms)}) during a 200-request rag-shaped replay (4 cached
16K documents + 100-token questions, 32 output tokens), stock vs ext, gc frozen first as SGLang does.

From the repo root, with the venv's SGLang patched (make apply):
    .venv-0.5.17/bin/python bench/results/raw/2026-12-01-h200-fa3-hits/cpu-checks/gc_rag_replay.py
"""

import gc
import random
import sys
import time

sys.path.insert(0, "bench")
from schedule_replay import ReplayConfig, ReplayScheduler, TraceReq  # noqa: E402


def collections(ext: bool) -> dict[int, tuple[int, float]]:
    replay = ReplayScheduler(ReplayConfig(ext=ext, chunked_prefill_size=8192, overlap=True))
    rng = random.Random(0)
    docs = [[rng.randrange(1000, 100000) for _ in range(16384)] for _ in range(4)]
    gc.collect()
    gc.freeze()
    stats = {g: [0, 0.0] for g in range(3)}
    began = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            stats[info["generation"]][0] += 1
            stats[info["generation"]][1] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)
    for i in range(200):
        question = [rng.randrange(1000, 100000) for _ in range(100)]
        replay.add(TraceReq(rid=f"r{i}", tokens=tuple(docs[i % 4] + question), max_new_tokens=32))
        for _ in range(3):
            if replay.busy():
                replay.step()
    while replay.busy():
        replay.step()
    gc.callbacks.remove(on_gc)
    gc.unfreeze()
    return {g: (n, round(1e3 * s, 2)) for g, (n, s) in stats.items()}


for ext in (False, True):
    print("ext" if ext else "stock", collections(ext))
