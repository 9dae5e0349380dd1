"""CPU time of the scheduling pass that admits a 100-token question over a cached 16K document
(bench/replay/schedule_replay.py's ReplayScheduler, overlap on), stock vs ext, 300 hits each, twice.

From the repo root, with the venv's SGLang patched (make apply):
    .venv-0.5.17/bin/python bench/results/raw/2026-12-01-h200-fa3-hits/cpu-checks/hit_pass_cpu.py
"""

import random
import statistics
import sys
import time

sys.path.insert(0, ".")  # run from the repository root
from bench.replay.schedule_replay import ReplayConfig, ReplayScheduler, TraceReq  # noqa: E402


def hit_pass_ms(ext: bool) -> list[float]:
    replay = ReplayScheduler(ReplayConfig(ext=ext, chunked_prefill_size=8192, overlap=True))
    rng = random.Random(0)
    doc = [rng.randrange(1000, 100000) for _ in range(16384)]
    replay.add(TraceReq(rid="doc", tokens=tuple(doc), max_new_tokens=1))
    while replay.busy():
        replay.step()
    times = []
    for i in range(300):
        question = [rng.randrange(1000, 100000) for _ in range(100)]
        replay.add(TraceReq(rid=f"r{i}", tokens=tuple(doc + question), max_new_tokens=8))
        start = time.perf_counter()
        replay.step()
        times.append(1e3 * (time.perf_counter() - start))
        while replay.busy():
            replay.step()
    return times


for ext in (False, True, False, True):
    t = sorted(hit_pass_ms(ext))
    print(
        "ext" if ext else "stock",
        "hit pass ms median",
        round(statistics.median(t), 3),
        "p90",
        round(t[270], 3),
    )
