#!/usr/bin/env python3
"""What `--prefill-ext-log-fingerprints` costs per request: `doctor.fingerprint.fingerprint` on a
prompt held as a list of Python ints (as the tokenizer hands it to the scheduler, whose
request-log hook computes it when the request finishes), per prompt length, and the size it adds to
the request's log line. No SGLang needed.

    python -m bench.replay.fingerprint_cost                # 1K 8K 32K 128K
    python -m bench.replay.fingerprint_cost --lengths 131072 --repeats 50
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import statistics
import sys
import time

from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.doctor.fingerprint import fingerprint
from sglang_prefill_ext.runner.pass_cost import PassCost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768, 131072])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    block, salt = PrefillExtConfig().fingerprint_block, "a-salt"
    cost = PassCost()
    print(
        f"command: python -m bench.replay.fingerprint_cost {' '.join(argv if argv is not None else sys.argv[1:])}"
    )
    print(
        f"machine: {platform.machine()} {platform.system()}, {platform.python_implementation()} {platform.python_version()}"
    )
    print(f"block {block}, salted; {args.repeats} runs per length, each on a fresh list of random ids\n")
    print(
        "| prompt tokens | median ms | min ms | max ms | grid / anchored blocks | log line bytes added | of the 8B prefill (pass-cost model) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rng = random.Random(0)
    for n in args.lengths:
        times = []
        for _ in range(args.repeats):
            ids = [rng.randrange(1000, 128000) for _ in range(n)]
            start = time.perf_counter()
            fp = fingerprint(ids, block, salt)
            times.append(1e3 * (time.perf_counter() - start))
        fields = {"start_ms": 12345.678, "fp_block": block, **dataclasses.asdict(fp)}
        added = len(json.dumps(fields, separators=(",", ":")))
        share = statistics.median(times) / (cost.fixed_ms + cost.variable_ms(n, 0))
        print(
            f"| {n:,} | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} | "
            f"{len(fp.blocks)} / {len(fp.anchors)} | {added:,} | {100 * share:.3f} % |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
