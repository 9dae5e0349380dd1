"""Chunk blending's between-pass steps (`adapters/v0_5_17/blending.py`) on SGLang 0.5.17's real `Req`,
`ReqToTokenPool`, `TokenToKVPoolAllocator`, `MHATokenToKVPool` and `PrefillExtRadixCache`.

No model and no scheduler: each pass does what `PrefillAdder` (the extend range), `alloc_for_extend`
(slots for the extend in the request's row, `req.kv`) and the forward (each computed slot's K and V,
a function of its token and position) do. Between passes SGLang's own `cache_unfinished_req` runs,
then `place_next`; at the end `finish` and SGLang's own `release_kv_cache`. Checked: the passes are
the plan's extends, every slot of the row holds its token's KV at its position before each pass, the
tree takes only the exact tokens, each reused chunk recomputes its ratio's head, an abort between
passes stores nothing, and afterwards the pool passes SGLang's idle leak check. The one pass
(`pend`, `take`, `place_all`): its whole extend allocated at once, the reused runs placed before the
forward writes the computed rows, the same KV in every slot."""

from __future__ import annotations

import math
from array import array

import pytest
import torch

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.managers.schedule_batch import Req, ReqKvInfo  # noqa: E402
from sglang.srt.managers.scheduler_components.invariant_checker import (  # noqa: E402
    SchedulerInvariantChecker,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.common import release_kv_cache  # noqa: E402
from sglang.srt.runtime_context import publish  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from sglang_prefill_ext import adapters, harness  # noqa: E402
from sglang_prefill_ext.adapters.v0_5_17.blending import Blending  # noqa: E402
from sglang_prefill_ext.blend.plan import BlendCounts  # noqa: E402
from tests.adapters.test_blend_kv import ROPE, Oracle, pool  # noqa: E402

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache
POOL_TOKENS = 160
SYSTEM, QUESTION = [1, 2, 3, 4], [5, 6, 7]
CHUNKS = {"A": list(range(10, 22)), "B": list(range(22, 30)), "C": [40, 41, 42, 43] * 2 + [44]}


@pytest.fixture
def v0_5_17(patched_sglang) -> None:
    if patched_sglang.version != "0.5.17":
        pytest.skip("the blending steps are 0.5.17's")


@pytest.fixture
def served(v0_5_17) -> Server:
    return Server()


class Server:
    def __init__(self, pool_tokens: int = POOL_TOKENS) -> None:
        publish(HARNESS.parse_server_args(), role="test")  # what `release_kv_cache` reads
        self.cache = PrefillExtRadixCache(HARNESS.cpu_cache_params("lru", 1, size=pool_tokens))
        self.kv, self.oracle, self.pool_tokens = pool(pool_tokens), Oracle(), pool_tokens
        self.blending = Blending(self.cache, self.kv, ROPE, 0.25, one_pass=True)

    def prompt(self, order: str) -> tuple[list[int], tuple[tuple[int, int], ...]]:
        tokens, spans = list(SYSTEM), []
        for name in order:
            spans.append((len(tokens), len(tokens) + len(CHUNKS[name])))
            tokens += CHUNKS[name]
        return tokens + QUESTION, tuple(spans)

    def admit(self, order: str, rid: str) -> Req:
        """`init_next_round_input` (the tree's match), the adder's lock and row, then `admit`."""
        tokens, spans = self.prompt(order)
        params = SamplingParams(max_new_tokens=1)
        params.normalize(None)
        req = Req(rid, "", array("q", tokens), params)
        req.init_next_round_input(self.cache)
        self.cache.inc_lock_ref(req.last_node)
        rows = self.cache.req_to_token_pool
        rows.alloc([req])
        rows.write((req.req_pool_idx, slice(0, len(req.prefix_indices))), req.prefix_indices.to(torch.int32))
        self.blending.admit(req, spans)
        return req

    def run_pass(self, req: Req, budget: int | None = None) -> tuple[int, int]:
        """One extend from the prefix's end to `extend_end` (or `budget` tokens less)."""
        start = len(req.prefix_indices)
        end = self.blending.extend_end(req)
        if budget is not None:
            end = min(end, start + budget)
        prefix = req.prefix_indices.to(torch.int64)
        assert torch.equal(self.row(req, start), prefix), "the next extend's prefix is not the request's row"
        self.check_row(req, start, "before a pass")
        slots = self.allocate(req, start, end)
        ids = torch.tensor(list(req.origin_input_ids[start:end]), dtype=torch.int64)
        self.oracle.write(self.kv, slots, ids, torch.arange(start, end))
        return start, end

    def allocate(self, req: Req, start: int, end: int) -> torch.Tensor:
        """What `alloc_for_extend` does for the extend [start, end): slots, the row, `req.kv`."""
        req.set_extend_range(start, end)
        slots = self.cache.token_to_kv_pool_allocator.alloc(end - start).to(torch.int64)
        self.cache.req_to_token_pool.write((req.req_pool_idx, slice(start, end)), slots.to(torch.int32))
        if req.kv is None:
            req.kv = ReqKvInfo(kv_allocated_len=end, swa_evicted_seqlen=0)
        req.kv.kv_allocated_len = req.kv_committed_len = end
        return slots

    def one_pass(self, req: Req) -> list[tuple[int, int]]:
        """`req`'s whole extend allocated, its reused runs placed, the forward's computed rows (each
        entry's) written; the entries."""
        start, end = len(req.prefix_indices), len(req.origin_input_ids)
        self.allocate(req, start, end)
        self.blending.pend(req)
        admission = self.blending.take(req)
        assert admission is not None and self.blending.take(req) is None  # taken once: its pass
        self.blending.place_all(req)
        entries = [(run.start, run.end) for run in admission.plan.extends]
        for lo, hi in entries:
            ids = torch.tensor(list(req.origin_input_ids[lo:hi]), dtype=torch.int64)
            self.oracle.write(self.kv, self.row(req, hi)[lo:], ids, torch.arange(lo, hi))
        self.check_row(req, end, "the prompt's KV after one pass")
        return entries

    def row(self, req: Req, length: int) -> torch.Tensor:
        return self.cache.req_to_token_pool.req_to_token[req.req_pool_idx, :length].to(torch.int64)

    def check_row(self, req: Req, length: int, what: str) -> None:
        row = self.row(req, length)
        ids = torch.tensor(list(req.origin_input_ids[:length]), dtype=torch.int64)
        self.oracle.check(self.kv, row, ids, torch.arange(length), what)

    def serve(self, order: str, rid: str, budget: int | None = None) -> tuple[Req, list[tuple[int, int]]]:
        req = self.admit(order, rid)
        passes = []
        while True:
            start, end = self.run_pass(req, budget)
            passes.append((start, end))
            if end == len(req.origin_input_ids):
                break
            self.cache.cache_unfinished_req(req, chunked=True)  # `stash_chunked_request`
            self.blending.place_next(req)
        self.check_row(req, end, "the prompt's KV")
        self.blending.finish(req, completed=True)
        req.finished_reason = "length"
        release_kv_cache(req, self.cache)
        return req, passes

    def check_idle(self) -> None:
        cache, allocator = self.cache, self.cache.token_to_kv_pool_allocator
        assert cache.protected_size() == 0
        leak, message = SchedulerInvariantChecker._check_pool_invariant(
            "full", allocator.available_size(), cache.evictable_size(), 0, 0, self.pool_tokens
        )
        assert not leak, message
        owned = torch.cat([allocator.free_pages, allocator.release_pages, cache.all_values_flatten()])
        assert torch.equal(torch.sort(owned.to(torch.int64)).values, torch.arange(1, 1 + self.pool_tokens))

    def matched(self, tokens: list[int]) -> int:
        return len(self.cache.match_prefix(MatchPrefixParams(key=HARNESS.radix_key(tokens))).device_indices)


def test_a_reordered_set_runs_the_ratio_s_heads_as_its_passes(served: Server) -> None:
    _, first = served.serve("ABC", "r0")
    tokens, _ = served.prompt("ABC")
    assert first == [(0, len(tokens))] and len(served.cache.tree.chunks) == 3
    served.check_idle()
    req, passes = served.serve("CAB", "r1")
    tokens, spans = served.prompt("CAB")
    heads = [math.ceil(0.25 * (end - start)) for start, end in spans]
    # the tree matched the system prompt; each pass computes a chunk's head, the last the question
    assert [end - start for start, end in passes] == [*heads, len(QUESTION)]
    assert [start for start, _ in passes] == [len(SYSTEM), *(end for _, end in spans)]
    # the tree took the exact tokens only: the system prompt and C's head
    assert served.matched(tokens) == spans[0][0] + heads[0]
    assert served.cache.exact_lens.get(req) == spans[0][0] + heads[0]
    served.check_idle()


def test_one_pass_places_every_reused_run_in_the_slots_of_its_extend(served: Server) -> None:
    """A reordered set (ABC, then CAB) in one pass: the whole prompt past the system prompt allocated
    at once, every reused run placed, the entries the ratio's heads and the question; SGLang's count of
    cached tokens takes the reused ones; the tree takes the exact tokens only; released, nothing
    leaks."""
    served.serve("ABC", "r0")
    req = served.admit("CAB", "r1")
    tokens, spans = served.prompt("CAB")
    heads = [math.ceil(0.25 * (end - start)) for start, end in spans]
    entries = served.one_pass(req)
    assert [start for start, _ in entries] == [len(SYSTEM), *(end for _, end in spans)]
    assert [end - start for start, end in entries] == [*heads, len(QUESTION)]
    reused = sum(end - start - head for (start, end), head in zip(spans, heads, strict=True))
    assert req.cached_tokens == reused  # placed; `prepare_for_extend` adds the tree's match
    served.blending.finish(req, completed=True)
    req.finished_reason = "length"
    release_kv_cache(req, served.cache)
    assert served.matched(tokens) == spans[0][0] + heads[0]
    served.check_idle()


def test_a_request_reusing_nothing_runs_as_an_ordinary_extend(served: Server) -> None:
    req = served.admit("AB", "r0")
    served.blending.pend(req)
    assert served.blending.take(req) is None  # nothing to place: the forward is SGLang's own
    assert served.run_pass(req) == (0, len(req.origin_input_ids))
    served.blending.finish(req, completed=True)
    req.finished_reason = "length"
    release_kv_cache(req, served.cache)
    served.check_idle()


def test_a_chunk_budget_splits_a_computed_run_without_changing_the_plan(served: Server) -> None:
    served.serve("ABC", "r0")
    _, passes = served.serve("CAB", "r1", budget=2)
    tokens, spans = served.prompt("CAB")
    computed = sum(end - start for start, end in passes)
    heads = [math.ceil(0.25 * (end - start)) for start, end in spans]
    assert computed == sum(heads) + len(QUESTION)
    assert all(end - start <= 2 for start, end in passes)
    served.check_idle()


def test_an_abort_between_passes_stores_nothing_and_frees_the_placed_run(served: Server) -> None:
    served.serve("AB", "r0")
    stored = len(served.cache.tree.chunks)
    req = served.admit("BAC", "r1")
    served.run_pass(req)
    served.cache.cache_unfinished_req(req, chunked=True)
    assert served.blending.place_next(req)
    counts = served.blending.finish(req, completed=False)
    # B and A reused but for their heads (ceil(0.25 n): 2 and 3), C computed whole (a miss)
    assert counts == BlendCounts(chunk_tokens=8 + 12 + 9, hits=2, reused_tokens=6 + 9, recomputed_tokens=5)
    req.finished_reason = "abort"
    release_kv_cache(req, served.cache)
    assert len(served.cache.tree.chunks) == stored  # C missed, but its prefill never ran
    served.check_idle()


def test_a_pool_too_short_for_a_reused_run_computes_the_rest(served: Server) -> None:
    served.serve("AB", "r0")
    req = served.admit("BA", "r1")
    served.run_pass(req)
    served.cache.cache_unfinished_req(req, chunked=True)
    # the pool full: every slot free or evictable taken, the store's entries locked by the request
    served.cache.evict(EvictParams(num_tokens=served.cache.evictable_size()))
    allocator = served.cache.token_to_kv_pool_allocator
    hold = allocator.alloc(allocator.available_size())
    assert served.cache.evictable_size() == 0
    assert not served.blending.place_next(req)
    start = len(req.prefix_indices)
    assert served.blending.extend_end(req) == len(req.origin_input_ids)
    plan = served.blending.admission(req).plan
    assert [run.reused for run in plan.runs] == [False, False]
    assert served.cache.exact_lens[req] == plan.exact_len == len(req.origin_input_ids)
    allocator.free(hold)
    assert served.run_pass(req) == (start, len(req.origin_input_ids))
    served.blending.finish(req, completed=True)
    req.finished_reason = "length"
    release_kv_cache(req, served.cache)
    served.check_idle()


def test_paged_pools_are_refused_for_now(v0_5_17) -> None:
    cache = PrefillExtRadixCache(HARNESS.cpu_cache_params("lru", 4, size=64))
    with pytest.raises(ValueError, match="needs --page-size 1"):
        Blending(cache, pool(64, 4), ROPE, 0.15)
