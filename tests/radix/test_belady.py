"""Belady's optimum over prefix accesses: hand-checked cases, exhaustive search on small cases, and
never worse than any eviction policy of stock RadixCache or PrefillExtRadixCache driven the same way."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

from bench.replay import eviction_bound  # noqa: E402
from sglang_prefill_ext import adapters, harness  # noqa: E402
from sglang_prefill_ext.config import EVICTION_POLICIES  # noqa: E402
from sglang_prefill_ext.radix.belady import Access, belady  # noqa: E402

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache
STOCK_POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]


def access(tokens: list[int], prompt_len: int | None = None) -> Access:
    return Access(np.array(tokens, dtype=np.int64), len(tokens) if prompt_len is None else prompt_len)


# ----- hand-checked -----


def test_a_loop_keeps_what_comes_back_first() -> None:
    """A B C A B C, 4 tokens each, room for 2: C evicts B (back last), A hits, B evicts A (never
    back) and misses, C hits. LRU would miss all six."""
    a, b, c = ([k] * 4 for k in (1, 2, 3))
    result = belady([access(a), access(b), access(c), access(a), access(b), access(c)], capacity=8)
    assert result.hits == [0, 0, 0, 4, 0, 4]
    assert (result.computed_tokens, result.recomputed_tokens) == (16, 4)


def test_a_shared_prefix_is_one_set_of_slots() -> None:
    """[1,2,3,4] then [1,2,5,6] then [1,2,3,4] with 4 slots: the second reuses [1,2] and evicts
    [3,4]; the third reuses [1,2] again and evicts [5,6] (never back)."""
    result = belady([access([1, 2, 3, 4]), access([1, 2, 5, 6]), access([1, 2, 3, 4])], capacity=4)
    assert result.hits == [0, 2, 2]
    assert result.reusable == [0, 2, 4]
    assert result.computed_tokens == 8


def test_only_the_tail_that_is_needed_goes() -> None:
    """6 tokens, then 2 unrelated with room for 7: one token of the first prompt goes, its deepest."""
    first = [1, 2, 3, 4, 5, 6]
    result = belady([access(first), access([8, 9]), access(first)], capacity=7)
    assert result.hits == [0, 0, 5]
    assert result.recomputed_tokens == 1


def test_kept_output_tokens_are_reusable_but_not_prompt() -> None:
    """A prompt of 3 whose path keeps 2 output tokens; the next prompt extends the path."""
    result = belady([access([1, 2, 3, 4, 5], prompt_len=3), access([1, 2, 3, 4, 5, 9])], capacity=6)
    assert result.prompt == [3, 6]
    assert result.hits == [0, 5]
    assert result.computed_tokens == 3 + 1


def test_a_path_larger_than_the_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="access 1 needs 5 resident tokens, capacity is 4"):
        belady([access([1]), access([1, 2, 3, 4, 5])], capacity=4)


# ----- exhaustive search -----


def exhaustive_min(accesses: list[Access], capacity: int) -> int:
    """The fewest prompt tokens computed over every sequence of prefix-closed resident sets (a
    token is a prefix tuple) that hold each access's path while it runs."""
    states = {frozenset(): 0}
    for acc in accesses:
        tokens = tuple(int(t) for t in acc.tokens)
        path = {tokens[: i + 1] for i in range(len(tokens))}
        nxt: dict[frozenset, int] = {}
        for state, cost in states.items():
            hit = 0
            while hit < acc.prompt_len and tokens[: hit + 1] in state:
                hit += 1
            optional = sorted(state - path)
            for keep in itertools.chain.from_iterable(
                itertools.combinations(optional, k) for k in range(len(optional) + 1)
            ):
                resident = frozenset(path.union(keep))
                if len(resident) > capacity or any(t[:-1] and t[:-1] not in resident for t in resident):
                    continue
                total = cost + acc.prompt_len - hit
                if total < nxt.get(resident, total + 1):
                    nxt[resident] = total
        states = nxt
    return min(states.values())


@st.composite
def small_traces(draw: st.DrawFn) -> tuple[list[Access], int]:
    capacity = draw(st.integers(2, 5))
    paths: list[list[int]] = []
    accesses = []
    for _ in range(draw(st.integers(1, 6))):
        base = draw(st.sampled_from(paths)) if paths and draw(st.booleans()) else []
        cut = draw(st.integers(0, len(base)))
        tokens = (base[:cut] + draw(st.lists(st.integers(0, 1), max_size=3)))[:capacity] or [0]
        prompt_len = draw(st.integers(1, len(tokens)))
        paths.append(tokens)
        accesses.append(access(tokens, prompt_len))
    return accesses, capacity


@settings(max_examples=300, deadline=None, derandomize=True)
@given(small_traces())
def test_belady_equals_exhaustive_search(case: tuple[list[Access], int]) -> None:
    accesses, capacity = case
    assert belady(accesses, capacity).computed_tokens == exhaustive_min(accesses, capacity)


# ----- against real caches -----


def computed_by(cache: object, accesses: list[Access]) -> int:
    """Prompt tokens `cache` computes serving `accesses` one at a time, as a server does: match the
    prompt and lock it, evict for the rest of the path, allocate, insert, free duplicates, unlock."""
    allocator = cache.token_to_kv_pool_allocator
    computed = 0
    for acc in accesses:
        prompt = HARNESS.radix_key(acc.tokens[: acc.prompt_len].tolist())
        match = cache.match_prefix(MatchPrefixParams(key=prompt))
        matched = HARNESS.matched_indices(cache, match)
        computed += acc.prompt_len - len(matched)
        cache.inc_lock_ref(match.last_device_node)
        need = len(acc.tokens) - len(matched)
        if allocator.available_size() < need:
            cache.evict(EvictParams(num_tokens=need - allocator.available_size()))
        value = torch.cat([matched, allocator.alloc(need)])
        result = cache.insert(InsertParams(key=HARNESS.radix_key(acc.tokens.tolist()), value=value))
        allocator.free(value[len(matched) : result.prefix_len])
        cache.dec_lock_ref(match.last_device_node)
        assert allocator.available_size() + cache.total_size() == allocator.size
    return computed


def caches(capacity: int) -> list[tuple[str, object]]:
    def params(policy: str) -> CacheInitParams:
        allocator = TokenToKVPoolAllocator(capacity, torch.int64, "cpu", None, need_sort=False)
        return CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=allocator,
            page_size=1,
            eviction_policy=policy,
        )

    stock = [(f"stock {p}", HARNESS.STOCK_RADIX_CACHE(params(p))) for p in STOCK_POLICIES]
    return stock + [(f"ext {p}", PrefillExtRadixCache(params(p))) for p in EVICTION_POLICIES]


@st.composite
def conversation_traces(draw: st.DrawFn) -> tuple[list[Access], int]:
    """Conversations that grow by a turn at a time, in a random or round-robin order, with a kept
    output token, over a pool a third to a whole of their final size."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, turns, first, turn = draw(st.integers(2, 6)), draw(st.integers(2, 5)), 8, 6
    round_robin = draw(st.booleans())
    order = (
        [c for _ in range(turns) for c in range(n)]
        if round_robin
        else list(rng.permutation(np.repeat(np.arange(n), turns)))
    )
    contexts = [list(rng.integers(1000, 10**6, first)) for _ in range(n)]
    accesses = []
    for c in order:
        prompt = contexts[c]
        output = int(rng.integers(1000, 10**6))
        accesses.append(access([*prompt, output], prompt_len=len(prompt)))
        contexts[c] = [*prompt, output, *rng.integers(1000, 10**6, turn)]
    final = first + turns * (turn + 1)
    capacity = draw(st.integers(final + 1, max(final + 1, n * final)))
    return accesses, capacity


@settings(max_examples=40, deadline=None, derandomize=True)
@given(conversation_traces())
def test_belady_is_never_worse_than_any_policy(case: tuple[list[Access], int]) -> None:
    accesses, capacity = case
    optimum = belady(accesses, capacity).computed_tokens
    for name, cache in caches(capacity):
        assert optimum <= computed_by(cache, accesses), name


# ----- a GPU run's pressure workload, from the TTFT bench's records -----


def pressure_run(folder: Path, label: str, cached: list[int]) -> None:
    """What ttft_bench.py's pressure workload writes: 3 sessions x 3 turns, round-robin, prompts of
    6 then + 4 output + 5 tool tokens, `cached` tokens served from cache per request."""
    folder.mkdir()
    prompts, reusable = [6, 6, 6], [0, 0, 0]
    records = []
    for idx in range(9):
        session, turn = idx % 3, idx // 3
        records.append(
            {
                "workload": "pressure",
                "idx": idx,
                "t_send": 0.1 * idx,
                "session": session,
                "turn": turn + 1,
                "prompt_tokens": prompts[session],
                "output_tokens": 4,
                "cached_tokens": cached[idx],
                "reusable_tokens": reusable[session],
                "error": None,
            }
        )
        reusable[session] = prompts[session] + 3
        prompts[session] += 4 + 5
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    prompt = sum(r["prompt_tokens"] for r in records)
    workload = {
        "pool_tokens": 30,
        "sessions": 3,
        "reusable_tokens": sum(r["reusable_tokens"] for r in records),
        "recomputed_tokens": sum(max(0, r["reusable_tokens"] - r["cached_tokens"]) for r in records),
        "hit_rate": sum(cached) / prompt,
    }
    (folder / "summary.json").write_text(json.dumps({"label": label, "workloads": {"pressure": workload}}))


def test_eviction_bound_rebuilds_a_pressure_run(tmp_path: Path) -> None:
    pressure_run(tmp_path / "stock", "stock", [0] * 9)
    pressure_run(tmp_path / "ext", "ext", [0, 0, 0, 9, 9, 0, 18, 0, 0])
    lines = eviction_bound.rows(
        [(label, *eviction_bound.load(tmp_path / label)) for label in ("stock", "ext")]
    )
    # Session paths: 9 tokens after turn 1, 18 after turn 2; 30 slots hold 3 x 9, then 1 x 18 + 1 x 9.
    chains = [
        Access(s * eviction_bound.SESSION_STRIDE + np.arange(6 + 9 * t + 3), 6 + 9 * t)
        for t in range(3)
        for s in range(3)
    ]
    optimum = belady(chains, 30)
    assert optimum.reusable == [0, 0, 0, 9, 9, 9, 18, 18, 18]
    stock, ext, best = (line.split(" | ") for line in lines[2:])
    assert stock[4] == "81" and stock[6] == "0.00 |"
    assert ext[4] == f"{81 - 36}"
    assert best[4] == f"{optimum.recomputed_tokens:,}"
    assert float(ext[6].rstrip(" |")) == pytest.approx(36 / (81 - optimum.recomputed_tokens), abs=0.005)
