"""The extension's token-id check on the tokenizer manager's TTFT path: Python max() + min() (as of
commit cdcd1bb) against the packed check of `adapters.common.validate_token_ids`, per row length.

    .venv-0.5.17/bin/python bench/results/raw/2026-12-01-h200-fa3-hits/cpu-checks/validate_ids_cpu.py
"""

import random
import timeit

from sglang_prefill_ext.adapters.common import validate_token_ids

VOCAB = 128256


def python_walk(row: list[int]) -> None:
    if max(row) >= VOCAB or min(row) < 0:
        raise ValueError(row)


def never_called(row: list[int], vocab_size: int) -> None:
    raise AssertionError("a valid row reached the slow path")


for n in (1024, 16384, 100_000):
    row = [random.randrange(VOCAB) for _ in range(n)]
    reps = max(20, 2_000_000 // n)
    old = timeit.timeit(lambda row=row: python_walk(row), number=reps) / reps * 1e3
    new = (
        timeit.timeit(lambda row=row: validate_token_ids(row, VOCAB, never_called), number=reps) / reps * 1e3
    )
    print(f"{n:>7} ids: max+min {old:.3f} ms, packed {new:.3f} ms ({old / new:.1f}x)")
