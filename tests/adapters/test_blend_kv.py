"""Chunk blending over SGLang's real KV pool and allocators (adapters.blend): admission, placement of
reused KV, storing on a miss, release.

- `write_reused` on SGLang's `MHATokenToKVPool`: keys cached at p and moved to q equal keys rotated at q
  by SGLang's own table, V copied, nothing else written.
- A state machine of blended requests on `PrefillExtRadixCache` over SGLang's `TokenToKVPoolAllocator`
  and `PagedTokenToKVPoolAllocator` (every policy, pages of 1 and 4, ratios 0 to 1): prompts of a system
  prompt, chunks of a small library in any order, glue and a question. Each slot's K and V are a
  function of its token and position: computed slots get them written, reused runs must get them from
  the store through `place`. After every step each pool slot has exactly one owner, the sizes are what
  is held, every slot of the store and of a request in flight holds its token's KV at its position;
  when nothing is in flight, SGLang's own pool invariant (the idle leak check's) holds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.managers.scheduler_components.invariant_checker import (  # noqa: E402
    SchedulerInvariantChecker,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402

from sglang_prefill_ext import adapters, harness  # noqa: E402
from sglang_prefill_ext.adapters import blend  # noqa: E402
from sglang_prefill_ext.ops.rope import Rope  # noqa: E402
from sglang_prefill_ext.radix.eviction import POLICIES  # noqa: E402
from tests.ops.rotary import PLAIN, YARN, max_relative_error, rotated, sglang_rope  # noqa: E402
from tests.radix.pool_slots import PoolAccounting  # noqa: E402
from tests.radix.profiles import StepCounter, machine_settings  # noqa: E402

HARNESS = harness.current("testing")
PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache
POOL_TOKENS = 192
VOCAB, LAYERS, HEADS, DIM = 48, 2, 2, 16
ROPE = Rope(DIM, 10000.0)


def pool(size: int, page_size: int = 1, heads: int = HEADS, dim: int = DIM, dtype=torch.float32):
    return MHATokenToKVPool(size, page_size, dtype, heads, dim, LAYERS, "cpu", False, enable_alt_stream=False)


@pytest.mark.parametrize("rope", [PLAIN, YARN], ids=["plain", "yarn"])
def test_write_reused_moves_keys_to_their_new_positions(rope: Rope) -> None:
    table = sglang_rope(rope).cos_sin
    kv = pool(64, heads=2, dim=rope.head_dim)
    raw = torch.randn(LAYERS, 10, 2, rope.head_dim, generator=torch.Generator().manual_seed(0))
    src, dst = torch.arange(3, 13), torch.arange(40, 50)
    cached, moved_to = torch.arange(100, 110), torch.arange(9000, 9010)
    for layer in range(LAYERS):
        kv.k_buffer[layer][src] = rotated(raw[layer], cached, table)
        kv.v_buffer[layer][src] = raw[layer] + 1
    before_k = [k.clone() for k in kv.k_buffer]
    blend.write_reused(kv, rope, src, dst, cached, moved_to)
    for layer in range(LAYERS):
        want = rotated(raw[layer], moved_to, table)
        assert max_relative_error(kv.k_buffer[layer][dst], want) < 1e-5
        assert torch.equal(kv.v_buffer[layer][dst], kv.v_buffer[layer][src])
        untouched = torch.ones(65, dtype=torch.bool)
        untouched[dst] = False
        assert torch.equal(kv.k_buffer[layer][untouched], before_k[layer][untouched])


def test_pools_blending_cannot_address_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="quantized KV cache"):
        blend.check_pool(pool(16, dtype=torch.float8_e4m3fn))
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1")
    with pytest.raises(ValueError, match="HND KV layout"):
        blend.check_pool(pool(16))
    monkeypatch.delenv("SGLANG_USE_HND_KVCACHE")
    blend.check_pool(pool(16))


class Oracle:
    """Each token's K (before RoPE) and V per layer; a slot holds them for its token at its position."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(7)
        self.k = torch.randn(VOCAB, LAYERS, HEADS, DIM, generator=gen)
        self.v = torch.randn(VOCAB, LAYERS, HEADS, DIM, generator=gen)

    def keys(self, tokens: torch.Tensor, positions: torch.Tensor, layer: int) -> torch.Tensor:
        angles = positions.float()[:, None] * ROPE.inv_freq()
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = self.k[tokens, layer].chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def write(self, kv, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        for layer in range(LAYERS):
            kv.k_buffer[layer][slots] = self.keys(tokens, positions, layer)
            kv.v_buffer[layer][slots] = self.v[tokens, layer]

    def check(
        self, kv, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, what: str
    ) -> None:
        for layer in range(LAYERS):
            k_err = (kv.k_buffer[layer][slots] - self.keys(tokens, positions, layer)).abs()
            assert bool((k_err < 1e-4).all()), f"{what}: layer {layer} K off by {k_err.max()}"
            assert torch.equal(kv.v_buffer[layer][slots], self.v[tokens, layer]), f"{what}: layer {layer} V"


class Request:
    def __init__(
        self, tokens: list[int], node, matched: torch.Tensor, admission: blend.BlendAdmission
    ) -> None:
        self.tokens = tokens
        self.node = node
        self.matched = matched
        self.admission = admission
        self.fresh = torch.empty(0, dtype=torch.int64)

    @property
    def row(self) -> torch.Tensor:
        return torch.cat([self.matched, self.fresh])


class BlendServingMachine(PoolAccounting, RuleBasedStateMachine):
    pool_tokens = POOL_TOKENS

    @initialize(
        page_size=st.sampled_from([1, 4]),
        policy=st.sampled_from(sorted(POLICIES)),
        ratio=st.sampled_from([0.0, 0.15, 0.5, 1.0]),
        library=st.lists(
            st.lists(st.integers(0, VOCAB - 1), min_size=3, max_size=14), min_size=2, max_size=5
        ),
    )
    def setup(self, page_size: int, policy: str, ratio: float, library: list[list[int]]) -> None:
        self.cache = PrefillExtRadixCache(HARNESS.cpu_cache_params(policy, page_size, size=POOL_TOKENS))
        self.allocator = self.cache.token_to_kv_pool_allocator
        self.kv = pool(POOL_TOKENS, page_size)
        self.oracle = Oracle()
        self.page_size, self.ratio, self.library = page_size, ratio, library
        self.systems = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]
        self.in_flight: list[Request] = []

    def _alloc(self, need: int) -> torch.Tensor | None:
        """`need` slots rounded up to whole pages (the request owns its last page's padding too)."""
        need = -(-need // self.page_size) * self.page_size
        if need and self.allocator.available_size() < need:
            self.cache.evict(EvictParams(num_tokens=need - self.allocator.available_size()))
        return self.allocator.alloc(need) if need else torch.empty(0, dtype=torch.int64)

    @rule(
        system=st.integers(0, 1),
        order=st.lists(st.integers(0, 4), unique=True, max_size=3),
        glue=st.integers(0, 2),
        question=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
    )
    def admit(self, system: int, order: list[int], glue: int, question: list[int]) -> None:
        tokens, spans = list(self.systems[system]), []
        for index in order:
            chunk = self.library[index % len(self.library)]
            spans.append((len(tokens), len(tokens) + len(chunk)))
            tokens += chunk + [0] * glue
        tokens += question
        spans = tuple(spans)
        # SGLang leaves a prompt's last token to compute (its logits)
        match = self.cache.match_prefix(MatchPrefixParams(key=HARNESS.radix_key(tokens[:-1])))
        self.cache.inc_lock_ref(match.last_device_node)
        matched = HARNESS.matched_indices(self.cache, match).to(torch.int64)
        ids = np.array(tokens, dtype=np.int64)
        admission = blend.lock(
            self.cache, blend.plan_of(self.cache, ids, None, spans, len(matched), self.ratio)
        )
        request = Request(tokens, match.last_device_node, matched, admission)
        self.in_flight.append(request)
        fresh = self._alloc(len(tokens) - len(matched))
        if fresh is None:
            self.in_flight.remove(request)
            self._release(request)
            return
        request.fresh = fresh.to(torch.int64)
        row, positions, ids_t = request.row[: len(tokens)], torch.arange(len(tokens)), torch.tensor(tokens)
        for run in admission.plan.extends:  # what the model's extends compute
            part = slice(run.start, run.end)
            self.oracle.write(self.kv, row[part], ids_t[part], positions[part])
        blend.place(self.kv, ROPE, admission, row)
        self.oracle.check(self.kv, row, ids_t, positions, "a placed request")
        self._check_recompute(admission, spans)
        blend.store(self.cache, self.kv, admission, row)
        StepCounter.count("blend")

    def _check_recompute(self, admission: blend.BlendAdmission, spans: tuple) -> None:
        """Each reused chunk recomputes its first ceil(ratio * n) tokens, no more, no fewer, but for
        those the tree's match holds (a chunk's head stays in the tree after a blended request) and
        the first token past the match (the first extend's)."""
        for run in admission.plan.runs:
            if run.reused:
                start, end = spans[run.span]
                head = start + math.ceil(self.ratio * (end - start))
                assert run.start == max(head, admission.plan.prefix_len + 1)
                assert admission.entries[run.span].lock_ref > 0
        if self.ratio == 1.0:
            assert admission.plan.reused_tokens == 0

    def _release(self, request: Request) -> None:
        blend.release(self.cache, request.admission)
        self.cache.dec_lock_ref(request.node)

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick: int) -> None:
        """The tree takes the request's exact KV only: up to its first reused token, page-aligned."""
        request = self.in_flight.pop(pick % len(self.in_flight))
        row = request.row
        exact = request.admission.exact_len // self.page_size * self.page_size
        result = self.cache.insert(
            InsertParams(key=HARNESS.radix_key(request.tokens[:exact]), value=row[:exact])
        )
        self.allocator.free(row[len(request.matched) : result.prefix_len])
        self.allocator.free(row[max(exact, len(request.matched)) :])
        self._release(request)
        StepCounter.count("blend")

    @rule(num_tokens=st.integers(0, 96))
    def evict(self, num_tokens: int) -> None:
        self.cache.evict(EvictParams(num_tokens=num_tokens))
        assert all(e.alive for r in self.in_flight for e in r.admission.entries.values())
        StepCounter.count("blend")

    @invariant()
    def idle_pool_passes_sglangs_leak_check(self) -> None:
        if not hasattr(self, "cache") or self.in_flight:
            return
        leak, message = SchedulerInvariantChecker._check_pool_invariant(
            "full",
            self.allocator.available_size(),
            self.cache.evictable_size(),
            self.cache.protected_size(),
            0,
            POOL_TOKENS,
        )
        assert not leak, message
        assert self.cache.protected_size() == 0

    @invariant()
    def every_slot_holds_its_tokens_kv(self) -> None:
        if not hasattr(self, "cache"):
            return
        for entry in self.cache.tree.chunks.entries():
            tokens = torch.from_numpy(np.frombuffer(entry.tokens, dtype=np.int64).copy())
            positions = torch.arange(entry.depth, entry.depth + entry.size)
            self.oracle.check(self.kv, entry.value, tokens, positions, "a stored chunk")
        for node in self.cache.tree.nodes():
            tokens = torch.from_numpy(np.frombuffer(node.tokens, dtype=np.int64).copy())
            positions = torch.arange(node.depth, node.depth + node.size)
            self.oracle.check(self.kv, node.value, tokens, positions, "a tree node")


BlendServingMachine.TestCase.settings = machine_settings(ci_examples=150)
TestBlendServing = BlendServingMachine.TestCase


def test_a_reordered_chunk_set_hits_the_store_and_recomputes_the_ratios_heads() -> None:
    """A, B, C after a system prompt, then C, A, B: the tree matches the system prompt, the store hits
    all three chunks, and only each chunk's first ceil(0.25 * n) tokens are computed again."""
    cache = PrefillExtRadixCache(HARNESS.cpu_cache_params("lru", 1, size=POOL_TOKENS))
    kv, oracle = pool(POOL_TOKENS), Oracle()
    system, question = [1, 2, 3, 4], [5, 6]
    chunks = {"A": list(range(10, 22)), "B": list(range(22, 30)), "C": [40] * 9}

    def serve(order: str) -> tuple[blend.BlendAdmission, list[int]]:
        tokens, spans = list(system), []
        for name in order:
            spans.append((len(tokens), len(tokens) + len(chunks[name])))
            tokens += chunks[name]
        tokens += question
        match = cache.match_prefix(MatchPrefixParams(key=HARNESS.radix_key(tokens[:-1])))
        matched = HARNESS.matched_indices(cache, match).to(torch.int64)
        admission = blend.lock(
            cache, blend.plan_of(cache, np.array(tokens), None, tuple(spans), len(matched), 0.25)
        )
        row = torch.cat([matched, cache.token_to_kv_pool_allocator.alloc(len(tokens) - len(matched))])
        ids, positions = torch.tensor(tokens), torch.arange(len(tokens))
        for run in admission.plan.extends:
            oracle.write(
                kv, row[run.start : run.end], ids[run.start : run.end], positions[run.start : run.end]
            )
        blend.place(kv, ROPE, admission, row)
        oracle.check(kv, row, ids, positions, order)
        blend.store(cache, kv, admission, row)
        exact = admission.exact_len
        result = cache.insert(InsertParams(key=HARNESS.radix_key(tokens[:exact]), value=row[:exact]))
        cache.token_to_kv_pool_allocator.free(row[len(matched) : result.prefix_len])
        cache.token_to_kv_pool_allocator.free(row[exact:])
        locked = sorted(admission.entries)
        blend.release(cache, admission)
        return admission, locked

    first, _ = serve("ABC")
    assert first.plan.prefix_len == 0 and first.plan.reused_tokens == 0 and len(first.plan.stores) == 3
    assert len(cache.tree.chunks) == 3
    second, locked = serve("CAB")
    assert second.plan.prefix_len == len(system)  # the tree stayed exact: the system prompt, not A
    assert locked == [0, 1, 2] and second.plan.stores == ()
    heads = [math.ceil(0.25 * len(chunks[name])) for name in "CAB"]
    assert second.plan.reused_tokens == sum(len(chunks[name]) for name in "CAB") - sum(heads)
    assert [run.end - run.start for run in second.plan.extends] == [*heads, len(question)]
    assert cache.protected_size() == 0
    idle = cache.token_to_kv_pool_allocator.available_size() + cache.evictable_size()
    assert idle == POOL_TOKENS
