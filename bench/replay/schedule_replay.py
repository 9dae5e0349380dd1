#!/usr/bin/env python3
"""Replay request traces through the installed SGLang's real prefill scheduling on the CPU, stock vs ext.

No model runs. Each iteration does what the scheduler's event loop does around a forward: stash
the chunked request, call the real (patched) `Scheduler.get_new_batch_prefill` on a scheduler
whose prefill-path state is built by SGLang's own constructors (tree cache, KV allocator and
request pool on CPU tensors, `SchedulePolicy`, `PrefillAdder`, `ScheduleBatch.prepare_for_extend`
allocating `out_cache_loc`), then "runs" the batch by emitting one output token per finished
prefill and calling the same `release_kv_cache` / `maybe_cache_unfinished_req` paths as
`process_batch_result_prefill`; what differs between SGLang versions (0.5.17, 0.5.23) is in
`sglang_prefill_ext.harness.vX_Y_Z.replay`. A batch's requests join the running (decode) batch before
the next pass forms, as in `get_next_batch_to_run`; with --overlap, its result is processed one
iteration late, after the next batch is scheduled, as in SGLang's overlap event loop.

Reports, per trace and mode: prefill tokens computed (sum of extend lengths), the ideal (each
distinct token computed once), scheduling passes, decisions/s and CPU time per scheduling step.

    python -m bench.replay.schedule_replay                 # all traces, markdown table on stdout
    python -m bench.replay.schedule_replay --trace burst-4k --overlap
    python -m bench.replay.schedule_replay --doctor-logs out/doctor   # the cache doctor's traces

Needs the venv's SGLang patched: `make apply SGLANG_VERSION=<its version>`. Flag off is stock's own
tree cache (0.5.17: `RadixCache`; 0.5.23: `UnifiedRadixCache`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import platform
import random
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import CacheAwarePolicy, SchedulePolicy
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import RADIX_EVICTION_POLICY_CHOICES, add_radix_eviction_policy_choices

from sglang_prefill_ext import harness
from sglang_prefill_ext.config import DEFAULT_EVICTION, EVICTION_POLICIES
from sglang_prefill_ext.harness.common import ReplaySpec
from sglang_prefill_ext.radix.belady import Access, belady

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = REPO / "bench" / "models" / "llama3-8b-dummy"
OUTPUT_TOKEN = 7
VOCAB = 100_000


# ----- traces -----


@dataclasses.dataclass(frozen=True)
class TraceReq:
    """A prompt that arrives at iteration `arrival`, once every request in `after` finished."""

    rid: str
    tokens: tuple[int, ...]
    arrival: int = 0
    after: tuple[str, ...] = ()
    max_new_tokens: int = 1


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, VOCAB) for _ in range(n)]


def burst(n: int, shared: int, own: int, seed: int = 0) -> list[TraceReq]:
    """`n` requests at once: one uncached `shared`-token prefix, then `own` tokens each."""
    rng = random.Random(seed)
    prefix = _tokens(rng, shared)
    return [TraceReq(f"b{i}", tuple(prefix + _tokens(rng, own))) for i in range(n)]


def shared_doc(docs: int, per_doc: int, doc_len: int, question: int, seed: int = 1) -> list[TraceReq]:
    """Questions about a few documents, interleaved, arriving two per iteration."""
    rng = random.Random(seed)
    texts = [_tokens(rng, doc_len) for _ in range(docs)]
    reqs = [
        TraceReq(f"d{d}q{q}", tuple(texts[d] + _tokens(rng, question)), arrival=(q * docs + d) // 2)
        for q in range(per_doc)
        for d in range(docs)
    ]
    return reqs


def multi_turn(conversations: int, turns: int, system: int, user: int, seed: int = 2) -> list[TraceReq]:
    """Conversations sharing a system prompt; turn k+1 = turn k's prompt + its output + a new message."""
    rng = random.Random(seed)
    sys_prompt = _tokens(rng, system)
    reqs = []
    for c in range(conversations):
        prompt = sys_prompt + _tokens(rng, user)
        reqs.append(TraceReq(f"c{c}t0", tuple(prompt)))
        for t in range(1, turns):
            prompt = prompt + [OUTPUT_TOKEN] + _tokens(rng, user)
            reqs.append(TraceReq(f"c{c}t{t}", tuple(prompt), after=(f"c{c}t{t - 1}",)))
    return reqs


def cyclic_multi_turn(
    ratio: float,
    pool: int,
    turns: int = 4,
    first: int = 4096,
    tool: int = 6144,
    concurrency: int = 2,
    output: int = 1,
) -> list[TraceReq]:
    """bench/serving/ttft_bench.py's pressure workload: enough conversations for their final contexts to
    be `ratio` x `pool`, served turn by turn, round-robin, `concurrency` requests at a time (a
    request starts when the one `concurrency` places before it finished, a turn when the previous
    one did); turn k+1 = turn k's prompt + its `output` tokens (decoded one a step) + `tool` new tokens."""
    final = first + (turns - 1) * (output + tool)
    sessions = max(2, math.ceil(ratio * pool / final))
    rng = random.Random(7)
    prompts = [_tokens(rng, first) for _ in range(sessions)]
    reqs: list[TraceReq] = []
    for t in range(turns):
        previous_turn = tuple(r.rid for r in reqs[-sessions:])
        for s in range(sessions):
            ahead = (reqs[-concurrency].rid,) if len(reqs) >= concurrency else ()
            after = tuple(dict.fromkeys(previous_turn + ahead))
            reqs.append(TraceReq(f"s{s}t{t}", tuple(prompts[s]), after=after, max_new_tokens=output))
            prompts[s] = prompts[s] + [OUTPUT_TOKEN] * output + _tokens(rng, tool)
    return reqs


def unique(n: int, length: int, seed: int = 3) -> list[TraceReq]:
    rng = random.Random(seed)
    return [TraceReq(f"u{i}", tuple(_tokens(rng, length))) for i in range(n)]


def shared_doc_random(
    docs: int, questions: int, doc_len: int, question: int, seed: int = 6
) -> list[TraceReq]:
    """`questions` questions, one per iteration, each about a document drawn at random (reuse at
    random distances: what eviction policies are judged on)."""
    rng = random.Random(seed)
    texts = [_tokens(rng, doc_len) for _ in range(docs)]
    return [
        TraceReq(f"r{i}", tuple(texts[rng.randrange(docs)] + _tokens(rng, question)), arrival=i)
        for i in range(questions)
    ]


def multi_turn_random(conversations: int, turns: int, first: int, user: int, seed: int = 8) -> list[TraceReq]:
    """One request per iteration from a conversation drawn at random among the unfinished ones,
    each turn after the previous one finished (reuse at random distances, recency matters)."""
    rng = random.Random(seed)
    prompts = [_tokens(rng, first) for _ in range(conversations)]
    done = [0] * conversations
    reqs: list[TraceReq] = []
    while live := [c for c in range(conversations) if done[c] < turns]:
        c = rng.choice(live)
        after = (f"m{c}t{done[c] - 1}",) if done[c] else ()
        reqs.append(TraceReq(f"m{c}t{done[c]}", tuple(prompts[c]), arrival=len(reqs), after=after))
        prompts[c] = prompts[c] + [OUTPUT_TOKEN] + _tokens(rng, user)
        done[c] += 1
    return reqs


def one_at_a_time(prompts: list[list[int]], prefix: str) -> list[TraceReq]:
    """Each prompt once the one before it finished."""
    return [
        TraceReq(f"{prefix}{i}", tuple(p), after=(f"{prefix}{i - 1}",) if i else ())
        for i, p in enumerate(prompts)
    ]


def timestamp_front(
    n: int, shared: int, question: int, seed: int = 9
) -> tuple[list[TraceReq], list[TraceReq]]:
    """(planted, fixed): 6-14 tokens that differ per request (a timestamp) in front of a shared
    `shared`-token context and a question; fixed: the timestamp after the question."""
    rng = random.Random(seed)
    context = _tokens(rng, shared)
    parts = [(_tokens(rng, rng.randint(6, 14)), _tokens(rng, question)) for _ in range(n)]
    return (
        one_at_a_time([stamp + context + q for stamp, q in parts], "ts"),
        one_at_a_time([context + q + stamp for stamp, q in parts], "ts"),
    )


def shuffled_docs(
    n: int, preamble: int, doc_lens: tuple[int, ...], question: int, seed: int = 10
) -> tuple[list[TraceReq], list[TraceReq]]:
    """(planted, fixed): a preamble, the same retrieved documents in a new order per request, a
    question; fixed: the documents in one order."""
    rng = random.Random(seed)
    head = _tokens(rng, preamble)
    docs = [_tokens(rng, length) for length in doc_lens]
    orders, questions = [], []
    for _ in range(n):
        order = list(range(len(docs)))
        rng.shuffle(order)
        orders.append(order)
        questions.append(_tokens(rng, question))
    return (
        one_at_a_time(
            [head + sum((docs[d] for d in o), []) + q for o, q in zip(orders, questions, strict=True)], "rd"
        ),
        one_at_a_time([head + sum(docs, []) + q for q in questions], "rd"),
    )


def system_change(
    n: int, system: int, line_at: int, line: int, user: int, seed: int = 11
) -> tuple[list[TraceReq], list[TraceReq]]:
    """(planted, fixed): a shared system prompt whose `line` tokens at `line_at` change once,
    halfway through the trace, then a user message; fixed: that line after the rest of the
    system prompt."""
    rng = random.Random(seed)
    before, after = _tokens(rng, line_at), _tokens(rng, system - line_at - line)
    lines = (_tokens(rng, line), _tokens(rng, line))
    users = [_tokens(rng, user) for _ in range(n)]
    version = [lines[i >= n // 2] for i in range(n)]
    return (
        one_at_a_time([before + v + after + u for v, u in zip(version, users, strict=True)], "sp"),
        one_at_a_time([before + after + v + u for v, u in zip(version, users, strict=True)], "sp"),
    )


TRACES: dict[str, Callable[[], list[TraceReq]]] = {
    "burst-4k": lambda: burst(16, 4096, 256),
    "burst-32k": lambda: burst(16, 32768, 512),
    "shared-doc": lambda: shared_doc(4, 8, 6000, 200),
    "multi-turn": lambda: multi_turn(8, 4, 1024, 300),
    "unique": lambda: unique(16, 3000),
}


# Traces whose working set exceeds the eviction table's pools.
EVICTION_TRACES: dict[str, Callable[[], list[TraceReq]]] = {
    "multi-turn-24x6": lambda: multi_turn(24, 6, 512, 400),
    "multi-turn-random": lambda: multi_turn_random(12, 6, 2000, 1500),
    "shared-doc-random": lambda: shared_doc_random(8, 64, 6000, 100),
}


@dataclasses.dataclass(frozen=True)
class DoctorTrace:
    """A trace for the cache doctor: `planted` misses the cache by a prompt layout (or a small
    pool), `fixed` is the same traffic without it (None: a clean trace); `pool` the planted run's KV pool."""

    make: Callable[[], tuple[list[TraceReq], list[TraceReq] | None]]
    pattern: str | None
    pool: int = 1 << 20


DOCTOR_TRACES: dict[str, DoctorTrace] = {
    "timestamp-front": DoctorTrace(lambda: timestamp_front(16, 8000, 200), "dynamic"),
    "shuffled-docs": DoctorTrace(
        lambda: shuffled_docs(16, 300, (2900, 4100, 3300, 5000, 3700), 150), "reordered"
    ),
    "system-change": DoctorTrace(lambda: system_change(16, 12000, 3000, 40, 300), "changed_prefix"),
    # the same trace with a pool too small for its documents, fixed: with a large one
    "evicted-docs": DoctorTrace(
        lambda: (trace := EVICTION_TRACES["shared-doc-random"](), trace), "evicted", pool=24576
    ),
    **{
        name: DoctorTrace(lambda name=name: (TRACES[name](), None), None)
        for name in ("shared-doc", "multi-turn", "burst-4k", "unique")
    },
}


# The cyclic trace's working set over the pool, and the pool: the H200 pressure phase's
# (`--mem-fraction-static 0.2`, 8B-shaped model).
CYCLIC_RATIOS = (1.5, 2.0, 3.0)
PRESSURE_POOL = 104_438
PRESSURE_OUTPUT = 32  # bench/serving/ttft_bench.py --max-new-tokens: the GPU pressure phase's decodes


def ideal_prefill_tokens(trace: list[TraceReq], page_size: int = 1) -> int:
    """Every distinct prompt token computed once: the size of the trie of all prompts (page-aligned)."""
    root: dict = {}
    total = 0
    for req in trace:
        node = root
        tokens = req.tokens
        full = len(tokens) // page_size * page_size
        for start in range(0, full, page_size):
            key = tokens[start : start + page_size]
            child = node.get(key)
            if child is None:
                child = node[key] = {}
                total += page_size
            node = child
        total += len(tokens) - full
    return total


# ----- the scheduler under replay -----


@dataclasses.dataclass
class ReplayConfig:
    ext: bool
    page_size: int = 1
    pool_tokens: int = 1 << 20
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    schedule_policy: str = "fcfs"
    overlap: bool = False
    extra_args: tuple[str, ...] = ()

    def server_argv(self) -> list[str]:
        argv = [
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--page-size",
            str(self.page_size),
            "--chunked-prefill-size",
            str(self.chunked_prefill_size),
            "--max-prefill-tokens",
            str(max(self.chunked_prefill_size, 16384)),
            "--schedule-policy",
            self.schedule_policy,
            "--max-running-requests",
            str(self.max_running_requests),
            "--pp-max-micro-batch-size",
            str(self.max_running_requests),
        ]
        if not self.overlap:
            argv.append("--disable-overlap-schedule")
        return argv + (["--enable-prefill-ext"] if self.ext else []) + list(self.extra_args)


@dataclasses.dataclass
class StepRecord:
    """One scheduling pass: who was admitted with which extend range (a mixed chunk's decodes, `riding`,
    included), how long it took, and the requests that decode a token in it (a decode step, or
    riding a mixed chunk; not one that an overlapped prefill result finished, which rides for nothing)."""

    admitted: list[tuple[str, int, int]]
    cpu_s: float
    decoded: list[str] = dataclasses.field(default_factory=list)
    riding: list[str] = dataclasses.field(default_factory=list)
    sliced: bool = False  # run in layer slices (--prefill-ext-yield-layers), passes between them


class SliceClock:
    """What a sliced pass tells the replay's caller (`mixed_replay.run_timed`: its simulated clock):
    a layer slice of a pass ran (`fraction` of its layers), a pass ran between two slices (its step
    record; a decode step or a prefill pass), the scheduler receives requests. Here: nothing."""

    def slice(self, batch: ScheduleBatch, fraction: float) -> None:
        pass

    def passed(self, step: StepRecord, decode: bool) -> None:
        pass

    def receive(self) -> None:
        pass


class _ReplayEngine:
    """`layer_yield.SliceEngine` on the replay: no forward; results as `ReplayScheduler.step` makes them."""

    def __init__(self, replay: ReplayScheduler) -> None:
        self.replay = replay

    @property
    def running_batch(self) -> ScheduleBatch:
        return self.replay.running_batch

    @running_batch.setter
    def running_batch(self, batch: ScheduleBatch) -> None:
        self.replay.running_batch = batch

    def forward_slice(self, batch: ScheduleBatch, reinit: bool) -> None:
        self.replay.slice_clock.slice(
            batch, batch.split_forward_count / self.replay.scheduler.model_config.num_hidden_layers
        )

    def receive(self) -> None:
        self.replay.slice_clock.receive()

    def run_pass(self, batch: ScheduleBatch) -> None:
        self.replay.pass_between_slices(batch)

    def decode_step(self) -> bool:
        return self.replay.decode_between_slices()


class ReplayScheduler:
    """SGLang's `Scheduler` prefill path over real CPU pools; `step()` is one event-loop iteration."""

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        self.kit = harness.current("replay")
        spec = ReplaySpec(
            argv=tuple(config.server_argv()),
            model_path=str(MODEL_CONFIG),
            pool_tokens=config.pool_tokens,
            page_size=config.page_size,
            max_running_requests=config.max_running_requests,
            row_tokens=1 << 16,  # the longest prompt of the traces + output
            chunked_prefill_size=config.chunked_prefill_size,
            overlap=config.overlap,
        )
        self.scheduler = self.kit.new_scheduler(spec)
        self.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
        self.steps: list[StepRecord] = []
        self.prefill_tokens = 0
        self.finished: dict[str, object] = {}
        self._pending = None
        self._sliced: ScheduleBatch | None = None  # the batch running in layer slices
        self.slice_clock = SliceClock()
        self.decode_steps = 0

    # ----- requests in -----

    def add(self, trace_req: TraceReq) -> object:
        params = SamplingParams(max_new_tokens=trace_req.max_new_tokens)
        params.normalize(None)
        req = Req(trace_req.rid, "", array("q", trace_req.tokens), params)
        req.vocab_size = self.scheduler.model_config.vocab_size  # checked when a request decodes
        req.time_stats.wait_queue_entry_time = time.perf_counter()
        self.scheduler.waiting_queue.append(req)
        return req

    # ----- one event-loop iteration -----

    def step(self) -> None:
        s = self.scheduler
        if self.forms_after_result():
            self._process_prefill_result(self._pending)
            self._pending = None
        if s.chunked_req is not None:
            s.stash_chunked_request(s.chunked_req)
        start = time.process_time()
        plan = Scheduler.get_new_batch_prefill(s, self.running_batch)
        cpu_s = time.process_time() - start
        batch = plan.batch_to_run
        self.running_batch = plan.running_batch  # emptied when a mixed chunk took its requests
        admitted = [] if batch is None else [(r.rid, *self.kit.extend_range(r)) for r in batch.reqs]
        glue = getattr(s, "prefill_ext_scheduler", None)
        sliced = batch is not None and glue is not None and glue.slices(batch, self.running_batch)
        self.steps.append(StepRecord(admitted, cpu_s, sliced=sliced))
        if sliced:
            self._run_sliced(batch)
        decoding = riding = None
        if batch is not None:
            self.prefill_tokens += batch.extend_num_tokens
            riding = batch.decoding_reqs  # a mixed chunk's decodes
            self.steps[-1].riding = [r.rid for r in riding or ()]
        elif not self.running_batch.is_empty():
            # SGLang's event loop: decode only when no prefill batch forms
            decoding = self._update_running_batch()
            riding = None if decoding is None else decoding.reqs
        if self.config.overlap:
            # The last pass's result, once this pass is launched; a copy, as `_join_running` filters the batch.
            if self._pending is not None:
                self._process_prefill_result(self._pending)
            self._pending = None if batch is None else batch.copy()
        self.steps[-1].decoded = [r.rid for r in riding or () if not r.finished()]
        if batch is not None and not self.config.overlap:
            self._process_prefill_result(batch)
        if decoding is not None:
            self._finish_decode(decoding)
        if batch is not None:
            self._join_running(batch)

    def _run_sliced(self, batch: ScheduleBatch) -> None:
        """The installed version's sliced run of `batch` (its adapter's `layer_yield`), on this replay."""
        from sglang_prefill_ext import adapters

        self._sliced = batch
        try:
            adapters.current("layer_yield").run_sliced(
                self.scheduler, self.scheduler.prefill_ext_scheduler, batch, _ReplayEngine(self)
            )
        finally:
            self._sliced = None

    def pass_between_slices(self, batch: ScheduleBatch) -> None:
        """A prefill pass between two layer slices: recorded, its result processed (no overlap)."""
        admitted = [(r.rid, *self.kit.extend_range(r)) for r in batch.reqs]
        riding = batch.decoding_reqs or []
        self.prefill_tokens += batch.extend_num_tokens
        step = StepRecord(admitted, 0.0, decoded=[r.rid for r in riding], riding=[r.rid for r in riding])
        self.steps.append(step)
        self._process_prefill_result(batch)
        self.slice_clock.passed(step, decode=False)

    def decode_between_slices(self) -> bool:
        """A decode step between two layer slices, if anyone decodes."""
        decoding = self._update_running_batch()
        if decoding is None:
            return False
        step = StepRecord([], 0.0, decoded=[r.rid for r in decoding.reqs if not r.finished()])
        self.steps.append(step)
        self._finish_decode(decoding)
        self.slice_clock.passed(step, decode=True)
        return True

    def forms_after_result(self) -> bool:
        """The patched overlap loop's check before it forms the next batch (`forms_after_result` of the
        extension's scheduler): process the pending result first, as for a lone long prompt's chunk."""
        glue = getattr(self.scheduler, "prefill_ext_scheduler", None)
        return (
            self._pending is not None
            and glue is not None
            and glue.forms_after_result(self._pending, self.running_batch, self.scheduler.chunked_req)
        )

    def _process_prefill_result(self, batch: ScheduleBatch) -> None:
        for req in self.kit.finish_prefill(self.scheduler, batch, OUTPUT_TOKEN):
            self.finished[req.rid] = req
            # get_next_batch_to_run: the batch shrank, so the scheduler may admit again.
            self.running_batch.batch_is_full = False

    def _join_running(self, batch: ScheduleBatch) -> None:
        """`get_next_batch_to_run`'s merge of the last batch into the running (decode) batch, before
        the next pass forms: all but finished requests and the continuing chunked one. Under overlap
        it comes before the batch's result is processed, so the batch's requests decode (or ride a
        mixed chunk) in the very next pass, as in SGLang; one that its prefill finishes rides that
        pass for nothing (`_finish_decode` skips it)."""
        keep = [i for i, r in enumerate(batch.reqs) if not r.finished() and r is not batch.chunked_req]
        if keep:
            batch.filter_batch(keep_indices=keep)
            if self.running_batch.is_empty():
                batch.batch_is_full = False
                self.running_batch = batch
            else:
                self.running_batch.merge_batch(batch)

    def _update_running_batch(self) -> ScheduleBatch | None:
        """`update_running_batch` (no retraction): the running batch less the requests an overlapped
        prefill result finished, set up for a decode step by SGLang's own `prepare_for_decode` (a KV
        slot per request, evicting from the tree when the pool is short); None when it is empty."""
        batch = self.running_batch
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return None
        batch.prepare_for_decode()
        return batch

    def _finish_decode(self, batch: ScheduleBatch) -> None:
        """The result of one decode step: each request emits `OUTPUT_TOKEN`, and those reaching their
        `max_new_tokens` are released into the tree as `process_batch_result_decode` does; as there, the
        finished stay in the running batch until a pass with no prefill filters them."""
        for req in self.kit.finish_decode(self.scheduler, batch, OUTPUT_TOKEN):
            self.finished[req.rid] = req
        batch.batch_is_full = False
        self.decode_steps += 1

    def busy(self) -> bool:
        s = self.scheduler
        return (
            bool(s.waiting_queue)
            or s.chunked_req is not None
            or self._pending is not None
            or not self.running_batch.is_empty()
        )

    def abort(self, rid: str) -> None:
        """SGLang's abort of a request: waiting -> dropped; chunked -> `process_pending_chunked_abort`."""
        s = self.scheduler
        s.waiting_queue = [r for r in s.waiting_queue if r.rid != rid]
        if s.chunked_req is not None and s.chunked_req.rid == rid:
            self.kit.abort_chunked(s)

    def protected_len(self, req: Req) -> int:
        """Tokens of `req`'s row the tree owns (matched or inserted)."""
        return self.kit.protected_len(req)

    def free_pages(self) -> torch.Tensor:
        """The allocator's free pages in the order it hands them out."""
        return self.kit.free_pages(self.scheduler.token_to_kv_pool_allocator)

    def as_rank(self, **ranks: int) -> contextlib.AbstractContextManager[None]:
        """The scheduler seen as the given TP / PP / CP ranks (e.g. `attn_tp_rank=1`)."""
        return self.kit.as_rank(self.scheduler, **ranks)

    # ----- KV accounting -----

    def kv_slots(self) -> dict[str, torch.Tensor]:
        """Every KV slot by owner: free in the allocator, held by the tree, held by a live request."""
        s = self.scheduler
        allocator = s.token_to_kv_pool_allocator
        pages = self.free_pages()
        if allocator.page_size > 1:
            pages = (pages[:, None] * allocator.page_size + torch.arange(allocator.page_size)).flatten()
        live = [r for r in s.waiting_queue if self.kit.holds_kv(r)]
        if s.chunked_req is not None:
            live.append(s.chunked_req)
        if self._pending is not None:
            live.extend(r for r in self._pending.reqs if self.kit.holds_kv(r))
        if self._sliced is not None:
            live.extend(r for r in self._sliced.reqs if self.kit.holds_kv(r))
        live.extend(r for r in self.running_batch.reqs if self.kit.holds_kv(r))  # decoding
        owned = [self.kit.owned_slots(s, r) for r in dict.fromkeys(live)]
        return {
            "free": pages.to(torch.int64),
            "tree": (
                s.tree_cache.all_values_flatten().to(torch.int64)
                if s.tree_cache.total_size()
                else torch.empty(0, dtype=torch.int64)
            ),
            "requests": torch.cat(owned).to(torch.int64) if owned else torch.empty(0, dtype=torch.int64),
        }

    def kv_accounting_errors(self) -> list[str]:
        """Empty when every slot of the pool has exactly one owner and the tree's counters add up."""
        s = self.scheduler
        slots = self.kv_slots()
        every = torch.cat(list(slots.values()))
        size = s.token_to_kv_pool_allocator.size
        first = s.token_to_kv_pool_allocator.page_size  # slot (page) 0 is the padding slot
        errors = []
        if len(every) and (int(every.min()) < first or int(every.max()) >= size + first):
            return [f"a slot outside the pool [{first}, {size + first})"]
        owners = torch.bincount(every - first, minlength=size)
        if bool((owners > 1).any()):
            errors.append("a slot has two owners (double free, or freed while the tree holds it)")
        if bool((owners == 0).any()):
            errors.append(f"{int((owners == 0).sum())} slots have no owner (leaked)")
        cache = s.tree_cache
        if cache.evictable_size() + cache.protected_size() != len(slots["tree"]):
            errors.append(
                f"tree holds {len(slots['tree'])} slots, counters say "
                f"{cache.evictable_size()} evictable + {cache.protected_size()} protected"
            )
        return errors


# ----- replay -----


@dataclasses.dataclass
class ReplayResult:
    trace: str
    mode: str
    prefill_tokens: int
    ideal_tokens: int
    passes: int
    decisions: int
    cpu_s: float

    @property
    def cpu_ms_per_step(self) -> float:
        return 1e3 * self.cpu_s / max(self.passes, 1)

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.cpu_s if self.cpu_s else float("inf")


def drive(replay: ReplayScheduler, trace: list[TraceReq], max_steps: int = 100_000) -> Iterator[int]:
    """Feed `trace` by arrival/dependency and step until all is done; yields each step's index."""
    todo = list(trace)
    for step in range(max_steps):
        ready = [t for t in todo if t.arrival <= step and all(rid in replay.finished for rid in t.after)]
        for t in ready:
            replay.add(t)
            todo.remove(t)
        if not todo and not replay.busy():
            return
        replay.step()
        yield step
    raise RuntimeError(f"replay did not finish in {max_steps} steps")


def replay_trace(name: str, trace: list[TraceReq], config: ReplayConfig) -> ReplayResult:
    replay = ReplayScheduler(config)
    for _ in drive(replay, trace):
        pass
    return ReplayResult(
        trace=name,
        mode=mode_name(config),
        prefill_tokens=replay.prefill_tokens,
        ideal_tokens=ideal_prefill_tokens(trace, config.page_size),
        passes=len(replay.steps),
        decisions=sum(len(s.admitted) for s in replay.steps),
        cpu_s=sum(s.cpu_s for s in replay.steps),
    )


def mode_name(config: ReplayConfig) -> str:
    return f"{'ext' if config.ext else 'stock'}-{config.schedule_policy}"


def long_queue(waiting: int, length: int, docs: int, seed: int = 4) -> tuple[list[TraceReq], list[TraceReq]]:
    """(`docs` short requests that cache a document each, `waiting` prompts = a document + own tokens)."""
    rng = np.random.default_rng(seed)
    doc_len = length // 2
    texts = rng.integers(1000, VOCAB, size=(docs, doc_len)).tolist()
    warm = [TraceReq(f"w{d}", tuple(texts[d] + [OUTPUT_TOKEN])) for d in range(docs)]
    own = rng.integers(1000, VOCAB, size=(waiting, length - doc_len)).tolist()
    queue = [TraceReq(f"q{i}", tuple(texts[i % docs] + own[i])) for i in range(waiting)]
    return warm, queue


@dataclasses.dataclass
class StepCost:
    mode: str
    waiting: int
    first_ms: float
    next_ms: float


def lpm_step_cost(queue_len: int, length: int, config: ReplayConfig, docs: int = 16) -> StepCost:
    """CPU time of the first scheduling pass over a long queue (every request new) and of the next one."""
    warm, queue = long_queue(queue_len, length, docs)
    replay = ReplayScheduler(config)
    for _ in drive(replay, warm):
        pass
    for t in queue:
        replay.add(t)
    replay.step()
    replay.step()
    first, second = replay.steps[-2:]
    return StepCost(mode_name(config), queue_len, 1e3 * first.cpu_s, 1e3 * second.cpu_s)


def stock_lpm_uncut_cost(queue_len: int, length: int, config: ReplayConfig, docs: int = 16) -> StepCost:
    """Stock LPM's own ordering (`_compute_prefix_matches` + `_sort_by_longest_prefix`) past its
    128-request cutoff, i.e. what `calc_priority` would cost if it did not fall back to FCFS."""
    warm, queue = long_queue(queue_len, length, docs)
    replay = ReplayScheduler(config)
    for _ in drive(replay, warm):
        pass
    reqs = [replay.add(t) for t in queue]
    policy = replay.scheduler.policy
    costs = []
    for _ in range(2):
        start = time.process_time()
        deprioritized = policy._compute_prefix_matches(reqs, CacheAwarePolicy.LPM)
        SchedulePolicy._sort_by_longest_prefix(reqs, deprioritized)
        costs.append(1e3 * (time.process_time() - start))
    return StepCost("stock-lpm, no cutoff (ordering only)", queue_len, *costs)


def admission_order(replay: ReplayScheduler) -> list[str]:
    """Request ids in the order the scheduler first admitted them."""
    return list(dict.fromkeys(rid for step in replay.steps for rid, _, _ in step.admitted))


def stock_policies() -> list[str]:
    """The installed SGLang's --radix-eviction-policy choices, lru first, fifo registered through
    SGLang's own hook (its FIFOStrategy is not offered on the command line). 0.5.23's tlru is left
    out: it needs a --radix-eviction-policy-config (a TTFT budget and next-prompt estimate in tokens)
    tuned to the workload, without which 0.5.23 refuses it as exactly LRU."""
    if "fifo" not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices(["fifo"])
    return sorted((p for p in RADIX_EVICTION_POLICY_CHOICES if p != "tlru"), key=lambda p: p != "lru")


def eviction_variants() -> list[tuple[str, bool, tuple[str, ...]]]:
    """(label, ext, extra server flags) of the eviction table, stock LRU first."""
    variants = [(f"stock RadixCache {p}", False, ("--radix-eviction-policy", p)) for p in stock_policies()]
    unprotected = ("--prefill-ext-eviction", "lru", "--prefill-ext-protect-waiting", "false")
    variants.append(("ext lru, dedup off, protect off", True, (*unprotected, "--prefill-ext-dedup", "false")))
    variants.append(("ext lru, protect off", True, unprotected))
    variants += [
        (f"ext {p}{' (default)' if p == DEFAULT_EVICTION else ''}", True, ("--prefill-ext-eviction", p))
        for p in EVICTION_POLICIES
    ]
    return variants


def eviction_cases(
    pools: list[int], cyclic_pool: int, names: list[str] | None
) -> Iterator[tuple[str, list[TraceReq], int]]:
    """(trace name, trace, pool) of the eviction table, the traces named in `names` (default: all)."""
    for name, make in EVICTION_TRACES.items():
        if names is None or name in names:
            trace = make()
            yield from ((name, trace, pool) for pool in pools)
    for ratio in CYCLIC_RATIOS:
        name = f"cyclic-{ratio:g}x"
        if names is None or name in names:
            yield name, cyclic_multi_turn(ratio, cyclic_pool), cyclic_pool
    # the GPU's pressure phase with its decodes: each request then caches its KV twice (after its
    # prefill, at its finish), which is what hid `reuse`'s gain there
    name = f"cyclic-2x-decode{PRESSURE_OUTPUT}"
    if names is None or name in names:
        yield name, cyclic_multi_turn(2.0, cyclic_pool, output=PRESSURE_OUTPUT), cyclic_pool


def eviction_rows(
    pools: list[int], chunked_prefill_size: int, cyclic_pool: int, names: list[str] | None = None
) -> list[str]:
    """Per trace and pool size: prefill tokens, hit rate and recomputed tokens of stock's policies
    and the extension's (same scheduling otherwise: fcfs; dedup and --prefill-ext-protect-waiting
    on unless the label says otherwise), Belady's optimum for the access order of the stock LRU
    run, and each row's position between stock LRU (0) and that optimum (1)."""
    lines = [
        "| trace | pool tokens | tree | prefill tokens | hit rate | recomputed vs ideal | LRU → Belady |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, trace, pool in eviction_cases(pools, cyclic_pool, names):
        prompt_tokens = sum(len(t.tokens) for t in trace)
        ideal = ideal_prefill_tokens(trace)
        rows, lru_order = [], None
        for label, ext, args in eviction_variants():
            config = ReplayConfig(
                ext=ext, pool_tokens=pool, chunked_prefill_size=chunked_prefill_size, extra_args=args
            )
            replay = ReplayScheduler(config)
            for _ in drive(replay, trace):
                pass
            lru_order = lru_order or admission_order(replay)
            rows.append((label, replay.prefill_tokens))
        by_rid = {t.rid: t for t in trace}
        accesses = [Access(np.array(by_rid[rid].tokens), len(by_rid[rid].tokens)) for rid in lru_order]
        rows.append(("Belady (offline optimum, stock LRU's order)", belady(accesses, pool).computed_tokens))
        lru, best = rows[0][1] - ideal, rows[-1][1] - ideal
        for label, tokens in rows:
            recomputed = tokens - ideal
            position = f"{(lru - recomputed) / (lru - best):.2f}" if lru > best else "-"
            lines.append(
                f"| {name} | {pool:,} | {label} | {tokens:,} | {1 - tokens / prompt_tokens:.3f} | "
                f"{recomputed:,} | {position} |"
            )
    return lines


@dataclasses.dataclass(frozen=True)
class DoctorRun:
    """A doctor trace replayed with ext, its request log written with fingerprints: the planted
    run's prefill tokens and, for a planted pattern, the fixed run's (their difference is what
    the fix saves, the replay's own count)."""

    trace: str
    log: Path
    prefill_tokens: int
    fixed_prefill_tokens: int | None

    @property
    def saved_tokens(self) -> int | None:
        return None if self.fixed_prefill_tokens is None else self.prefill_tokens - self.fixed_prefill_tokens


def doctor_run(name: str, out_dir: Path, chunked_prefill_size: int = 8192) -> DoctorRun:
    """Replay DOCTOR_TRACES[name] (and its fixed layout) through ext; the planted run's request log
    with fingerprints goes to OUT_DIR/<name>.jsonl."""
    spec = DOCTOR_TRACES[name]
    planted, fixed = spec.make()
    log = out_dir / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    logging = ("--prefill-ext-log", str(log), "--prefill-ext-log-fingerprints")
    config = ReplayConfig(
        ext=True, pool_tokens=spec.pool, chunked_prefill_size=chunked_prefill_size, extra_args=logging
    )
    tokens = replay_trace(name, planted, config).prefill_tokens
    fixed_tokens = None
    if fixed is not None:
        fixed_config = ReplayConfig(ext=True, chunked_prefill_size=chunked_prefill_size)
        fixed_tokens = replay_trace(name, fixed, fixed_config).prefill_tokens
    return DoctorRun(name, log, tokens, fixed_tokens)


def markdown(results: list[ReplayResult]) -> str:
    lines = [
        "| trace | mode | prefill tokens | ideal | tokens / ideal | passes | decisions/s | CPU ms / step |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.trace} | {r.mode} | {r.prefill_tokens:,} | {r.ideal_tokens:,} | "
            f"{r.prefill_tokens / r.ideal_tokens:.2f} | {r.passes} | {r.decisions_per_s:,.0f} | "
            f"{r.cpu_ms_per_step:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), help="default: all")
    parser.add_argument("--policy", action="append", choices=["fcfs", "lpm"], help="default: both")
    parser.add_argument("--overlap", action="store_true", help="process each result one iteration late")
    parser.add_argument("--chunked-prefill-size", type=int, default=8192)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--lpm-waiting", type=int, default=512, help="queue length of the LPM step-cost row")
    parser.add_argument(
        "--lpm-length", type=int, default=32768, help="prompt length of the LPM step-cost row"
    )
    parser.add_argument(
        "--eviction-pools",
        type=int,
        nargs="*",
        metavar="TOKENS",
        help="instead of the scheduling tables: the eviction table at these KV pool sizes",
    )
    parser.add_argument(
        "--cyclic-pool",
        type=int,
        default=PRESSURE_POOL,
        help="eviction table: the pool of the cyclic traces (sized from it at each of CYCLIC_RATIOS)",
    )
    parser.add_argument(
        "--eviction-trace",
        action="append",
        choices=[
            *EVICTION_TRACES,
            *(f"cyclic-{r:g}x" for r in CYCLIC_RATIOS),
            f"cyclic-2x-decode{PRESSURE_OUTPUT}",
        ],
        help="eviction table: only these traces (default: all)",
    )
    parser.add_argument(
        "--doctor-logs",
        type=Path,
        metavar="DIR",
        help="instead of the scheduling tables: replay the cache doctor's traces (DOCTOR_TRACES) with ext, "
        "each one's request log with fingerprints in DIR/<trace>.jsonl, and print what each fix saves",
    )
    args = parser.parse_args(argv)
    harness.require_patched()
    if args.doctor_logs:
        args.doctor_logs.mkdir(parents=True, exist_ok=True)
        print(
            "| trace | planted | prefill tokens | fixed layout | saved by the fix | log |\n|---|---|---:|---:|---:|---|"
        )
        for name, spec in DOCTOR_TRACES.items():
            run = doctor_run(name, args.doctor_logs, args.chunked_prefill_size)
            fixed = "-" if run.fixed_prefill_tokens is None else f"{run.fixed_prefill_tokens:,}"
            saved = "-" if run.saved_tokens is None else f"{run.saved_tokens:,}"
            print(
                f"| {name} | {spec.pattern or 'none'} | {run.prefill_tokens:,} | {fixed} | {saved} | {run.log} |"
            )
        return 0
    if args.eviction_pools:
        print(
            f"command: python -m bench.replay.schedule_replay {' '.join(argv if argv is not None else sys.argv[1:])}\n"
        )
        rows = eviction_rows(
            args.eviction_pools, args.chunked_prefill_size, args.cyclic_pool, args.eviction_trace
        )
        print("\n".join(rows))
        return 0

    results = []
    for name in args.trace or list(TRACES):
        trace = TRACES[name]()
        for policy in args.policy or ["fcfs", "lpm"]:
            for ext in (False, True):
                config = ReplayConfig(
                    ext=ext,
                    page_size=args.page_size,
                    chunked_prefill_size=args.chunked_prefill_size,
                    schedule_policy=policy,
                    overlap=args.overlap,
                )
                results.append(replay_trace(name, trace, config))
    print(
        f"command: python -m bench.replay.schedule_replay {' '.join(argv if argv is not None else sys.argv[1:])}"
    )
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {platform.system()}, python {platform.python_version()}, torch {torch.__version__}"
    )
    print(
        f"chunked-prefill-size {args.chunked_prefill_size}, page size {args.page_size}, overlap {args.overlap}\n"
    )
    print(markdown(results))
    if args.lpm_waiting:
        print(
            f"\nScheduling-pass CPU time, queue of N x {args.lpm_length}-token prompts (half a cached document each):\n"
        )
        print("| mode | N waiting | first pass ms | next pass ms |\n|---|---:|---:|---:|")
        rows = []
        for waiting in sorted({128, args.lpm_waiting}):
            for ext in (False, True):
                config = ReplayConfig(ext=ext, page_size=args.page_size, schedule_policy="lpm")
                rows.append(lpm_step_cost(waiting, args.lpm_length, config))
        config = ReplayConfig(ext=False, page_size=args.page_size, schedule_policy="lpm")
        rows.append(stock_lpm_uncut_cost(args.lpm_waiting, args.lpm_length, config))
        for row in rows:
            print(f"| {row.mode} | {row.waiting} | {row.first_ms:.1f} | {row.next_ms:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
