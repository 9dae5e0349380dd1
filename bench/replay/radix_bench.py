"""CPU benchmark: stock SGLang RadixCache vs PrefillExtRadixCache on the same generated workloads.

Runs on the installed SGLang (0.5.17 or 0.5.23), against that version's own stock `RadixCache`; no
patch needed.

For each page size and prompt length: tens of cached sequences sharing a common prefix and diverging
at random points. Reports the p50 of insert, first match, re-match of a waiting request (stock:
a full match_prefix again; ours: the request's match handle is extended) and evict, with ratios.

    python -m bench.replay.radix_bench [--workload diverging|shared] [--lengths 1024 8192 32768 131072] [--pages 1 16]
                                [--sequences 32] [--repeat 3]

Each workload runs `--repeat` times, stock and ours interleaved; the table shows the lowest p50 of the
repeats, the usual guard against other processes sharing the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

from sglang_prefill_ext import adapters, harness

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache

OPERATIONS = ("insert", "first match", "re-match", "evict")


class WaitingRequest:
    """A queued request as match_prefix sees it: the adapter keys its match handle on identity."""


def diverging_prompts(length: int, sequences: int, page_size: int, seed: int) -> list[array]:
    """One base prompt; each sequence diverges from it at a random page-aligned point in [L/4, L)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 32000, length)
    prompts = []
    for _ in range(sequences):
        cut = int(rng.integers(length // 4, length)) // page_size * page_size
        tokens = base.copy()
        tokens[cut:] = rng.integers(0, 32000, length - cut)
        prompts.append(array("q", tokens.tolist()))
    return prompts


def shared_prompts(length: int, sequences: int, page_size: int, seed: int, prefixes: int = 4) -> list[array]:
    """A few long prefixes (7/8 of the prompt, e.g. documents or system prompts), each shared by
    sequences / prefixes prompts that end in their own tokens; round-robin over the prefixes."""
    rng = np.random.default_rng(seed)
    shared = length * 7 // 8 // page_size * page_size
    heads = rng.integers(0, 32000, (prefixes, shared))
    return [
        array("q", np.concatenate([heads[i % prefixes], rng.integers(0, 32000, length - shared)]).tolist())
        for i in range(sequences)
    ]


WORKLOADS = {"diverging": diverging_prompts, "shared": shared_prompts}


def make_cache(cls: type, page_size: int, pool_tokens: int) -> Any:
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(pool_tokens, torch.int64, "cpu", None, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(
            pool_tokens, page_size, torch.int64, "cpu", None, need_sort=False
        )
    return cls.create_simulated(mock_allocator=allocator, page_size=page_size)


def timed(call: Callable[[Any], Any], argument: Any) -> float:
    start = time.perf_counter()
    call(argument)
    return time.perf_counter() - start


def run_workload(cls: type, prompts: list[array], page_size: int) -> dict[str, float]:
    """p50 seconds per operation for one cache class on one workload."""
    length = len(prompts[0])
    cache = make_cache(cls, page_size, pool_tokens=length * (len(prompts) + 1))
    allocator = cache.token_to_kv_pool_allocator
    samples: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    for prompt in prompts:
        matched = HARNESS.matched_indices(
            cache, cache.match_prefix(MatchPrefixParams(key=HARNESS.radix_key(prompt)))
        )
        value = torch.cat([matched, allocator.alloc(length - len(matched))])
        samples["insert"].append(
            timed(cache.insert, InsertParams(key=HARNESS.radix_key(prompt), value=value))
        )
    for prompt in prompts:
        # A follow-up turn: the whole cached prompt plus new tokens, matched while it waits in the queue.
        follow_up = prompt + array("q", range(64 * page_size))
        request = WaitingRequest()
        params = MatchPrefixParams(key=HARNESS.radix_key(follow_up), req=request)
        samples["first match"].append(timed(cache.match_prefix, params))
        params = MatchPrefixParams(key=HARNESS.radix_key(follow_up), req=request)
        samples["re-match"].append(timed(cache.match_prefix, params))
    while cache.evictable_size() > 0:
        samples["evict"].append(timed(cache.evict, EvictParams(num_tokens=length // 4)))
    return {op: statistics.median(values) for op, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768, 131072])
    parser.add_argument("--pages", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="diverging",
        help="diverging: prompts leave one base prompt at random points; shared: 4 long prefixes, own tails",
    )
    args = parser.parse_args()
    # Both caches clone and concatenate CPU tensors; torch's default intra-op threads turn a 1 MB
    # clone into milliseconds of thread hand-off on a busy 2-core box, noise that says nothing about
    # either tree (on the GPU these are device copies).
    torch.set_num_threads(1)

    print(
        f"SGLang {adapters.installed_version()}, stock {HARNESS.STOCK_RADIX_CACHE.__name__}, "
        f"workload {args.workload}\n"
    )
    print("| page | prompt tokens | operation | stock p50 (µs) | prefill-ext p50 (µs) | speed-up |")
    print("|---:|---:|---|---:|---:|---:|")
    for page_size in args.pages:
        for length in args.lengths:
            prompts = WORKLOADS[args.workload](length, args.sequences, page_size, args.seed)
            runs = [
                (
                    run_workload(HARNESS.STOCK_RADIX_CACHE, prompts, page_size),
                    run_workload(PrefillExtRadixCache, prompts, page_size),
                )
                for _ in range(args.repeat)
            ]
            stock = {op: min(run[0][op] for run in runs) for op in OPERATIONS}
            ours = {op: min(run[1][op] for run in runs) for op in OPERATIONS}
            for op in OPERATIONS:
                print(
                    f"| {page_size} | {length} | {op} | {stock[op] * 1e6:.1f} | {ours[op] * 1e6:.1f} "
                    f"| {stock[op] / ours[op]:.1f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
