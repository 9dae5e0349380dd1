"""What every version's scheduler adapter does the same way around the version-free `PrefillRunner`.

A version's `scheduler.py` subclasses `PrefillExtScheduler` with what its `Req` and
`SchedulePolicy` spell differently: `landed` (a flight's pages are in the tree or its producer
stopped), `position` (where a request's match ends), `_match` (SGLang's own prefix match of a
waiting request) and `_extend_end` (where the chunk just admitted ends). The fields read
here (`last_node`, `full_untruncated_fill_ids`, `time_stats`, `extend_batch_idx`, the adder's
`can_run_list` / `log_hit_tokens`, `CacheAwarePolicy.LPM`, ...) mean the same in every supported
version. Like the per-version modules, this imports SGLang only lazily: the patched
`mem_cache/common.py` loads it while SGLang's own modules are still loading.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sglang_prefill_ext.adapters import common
from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.doctor.fingerprint import fingerprint
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.runner import Flight, Position, PrefillRunner
from sglang_prefill_ext.runner.chunking import aligned_chunk_end, decode_adaptive_budget, divergence_points
from sglang_prefill_ext.runner.goodput import Goodput
from sglang_prefill_ext.runner.metrics import CounterDeltas
from sglang_prefill_ext.runner.request_log import (
    FingerprintedRecord,
    FlushRecord,
    JsonlLog,
    PassRecord,
    RequestRecord,
)
from sglang_prefill_ext.runner.short_first import Need, PassPlan, ShortFirst

if TYPE_CHECKING:
    from sglang_prefill_ext.adapters.tree_backed import PrefixTreeCacheMixin

Req = Any  # the version's `Req`
Adder = Any  # the version's `PrefillAdder`


def finished_in(running_batch: Any) -> int:
    """How many of SGLang's running batch's requests finished: they stay in it until a pass with no
    prefill to form filters them (`update_running_batch`), so while a prompt arriving as the last
    request finished is chunked they still count in its size, though nobody decodes."""
    return 0 if running_batch is None else sum(1 for req in running_batch.reqs if req.finished())


def nobody_decodes(running_batch: Any) -> bool:
    """No request of SGLang's running batch still decodes (`finished_in`)."""
    return finished_in(running_batch) == len(running_batch.reqs)


def _ms(start: float, end: float) -> float:
    return round(1e3 * (end - start), 3) if start and end else -1.0


@dataclasses.dataclass
class RequestTally:
    """What a request's `--prefill-ext-log` line counts, kept from its first admission: passes it
    waited in the queue, in-flight tokens it waited for, chunks the latency budget cut."""

    queue_passes: int
    deduped_tokens: int = 0
    budgeted_chunks: int = 0


def pass_budget(config: PrefillExtConfig, page_size: int) -> ShortFirst:
    """The per-pass budget: goodput scheduling (`--prefill-ext-tbt-target-ms`), else short requests
    first (`--prefill-ext-pass-budget-ms`; off at 0)."""
    if config.tbt_target_ms > 0:
        return Goodput(
            config.tbt_target_ms,
            config.short_ttft_target_ms,
            config.short_max_tokens,
            config.min_long_chunk,
            page_size,
            config.pass_cost,
            config.lone_pass_ms,
        )
    return ShortFirst(
        config.pass_budget_ms,
        config.short_max_tokens,
        config.short_window_s,
        config.min_long_chunk,
        page_size,
        config.pass_cost,
    )


class PrefillExtScheduler:
    """The adapter of one SGLang scheduler: the calls its patched `_get_new_batch_prefill_raw` makes,
    answered with its `PrefillRunner`'s decisions."""

    def __init__(
        self,
        policy: Any,
        tree_cache: PrefixTreeCacheMixin,
        config: PrefillExtConfig,
        page_size: int,
        metrics: bool = False,
        mixed_chunk: bool = False,
    ) -> None:
        self.policy = policy
        self.tree_cache = tree_cache
        self.config = config
        self.page_size = page_size
        schedule = config.schedule
        if schedule == "auto":
            schedule = "lpm-aging" if self._is_lpm(policy) else "stock"
        self.schedule = schedule
        self.runner = PrefillRunner(
            page_size,
            dedup=config.dedup,
            dedup_min_tokens=config.dedup_min_tokens,
            dedup_max_wait_passes=config.dedup_max_wait_passes,
            max_wait_passes=config.max_wait_passes,
            protect_waiting=config.protect_waiting,
        )
        self.pass_budget = pass_budget(config, page_size)
        self.lone_chunk_sync = config.lone_chunk_sync and config.tbt_target_ms > 0
        # True while a pass forms between two layer slices of a lone prompt's (--prefill-ext-yield-layers)
        self.between_slices = False
        self.clock = time.monotonic  # the CPU replay substitutes its simulated clock
        self.mixed_chunk = mixed_chunk  # running requests' decode tokens ride each prefill pass
        self.log = JsonlLog(config.log) if config.log else None
        self.pass_log = JsonlLog(config.pass_log) if config.pass_log else None
        self.metrics = CounterDeltas() if metrics else None
        self._hit_tokens = 0
        self._tallies: weakref.WeakKeyDictionary[Req, RequestTally] = weakref.WeakKeyDictionary()
        self._plan = PassPlan(0)
        self._riding = 0
        self._synced = False
        self._shorts: list[Need] = []
        self._chunk_continues = False  # this pass capped SGLang's chunked request, which continues
        self._adder: Adder | None = None
        self._tracked = 0
        self._waiting: list[Req] = []
        self._finished_running = 0  # in the running batch at this pass's calc_priority

    # ----- what each version spells its own way -----

    @staticmethod
    def landed(flight: Flight) -> bool:
        """The producer's pages are in the tree, or it stopped computing them (finished, aborted, retracted)."""
        raise NotImplementedError

    @staticmethod
    def position(req: Req, length: int) -> Position:
        """Where `req`'s match ends (its first `length` tokens as a transient int64 view)."""
        raise NotImplementedError

    @staticmethod
    def _extend_end(req: Req) -> int:
        raise NotImplementedError

    def _match(self, req: Req) -> int:
        """Re-match waiting `req` as stock's cache-aware ordering does; its matched prefix length."""
        raise NotImplementedError

    @staticmethod
    def _is_lpm(policy: Any) -> bool:
        from sglang.srt.managers.schedule_policy import CacheAwarePolicy

        return policy.policy == CacheAwarePolicy.LPM

    # ----- the patch's calls -----

    def forms_after_result(self, last_batch: Any, running_batch: Any, chunked_req: Req) -> bool:
        """The overlap event loop's question before it forms the next batch: wait for `last_batch`'s
        result first? True when `last_batch` was a lone long prompt's chunk that continues (its only
        request is `chunked_req`) and nobody decodes (`nobody_decodes`), under goodput scheduling
        with `--prefill-ext-lone-chunk-sync`: the next chunk is then formed once the running one
        finished, with the short requests that arrived while it ran, instead of ahead of them."""
        self._synced = (
            self.lone_chunk_sync
            and chunked_req is not None
            and last_batch is not None
            and last_batch.forward_mode.is_extend()
            and len(last_batch.reqs) == 1
            and last_batch.reqs[0] is chunked_req
            and nobody_decodes(running_batch)
        )
        return self._synced

    def slices(self, batch: Any, running_batch: Any) -> bool:
        """Run `batch` in layer slices (--prefill-ext-yield-layers)? True for a lone long prompt's
        prefill pass: one request bringing more than --prefill-ext-short-max-tokens new tokens, nobody
        decoding (so no decode waits for the slices)."""
        return (
            self.config.yield_layers > 0
            and batch.forward_mode.is_extend()
            and not batch.forward_mode.is_mixed()
            and len(batch.reqs) == 1
            and batch.extend_num_tokens > self.config.short_max_tokens
            and nobody_decodes(running_batch)
        )

    def calc_priority(self, waiting_queue: list[Req], running_batch: Any = None, **stock: Any) -> None:
        """In place of `SchedulePolicy.calc_priority` (`stock`: that version's further arguments)."""
        self.runner.begin_pass(waiting_queue, self.landed)
        self._adder, self._tracked, self._waiting = None, 0, waiting_queue
        self._finished_running = finished_in(running_batch)
        self._chunk_continues = False
        if self.schedule == "stock":
            self.policy.calc_priority(waiting_queue, running_batch, **stock)
        else:
            self.runner.order(waiting_queue, self._stamp, self._match)
            if self.policy.enable_priority_scheduling:
                sign = self.policy.priority_sign
                waiting_queue.sort(key=lambda r: r.priority * sign)
        self.runner.protect(waiting_queue, self._stamp, self._match, self._touch)
        if self.pass_budget.enabled:
            self.runner.refresh(waiting_queue, self._stamp, self._match)
            self._shorts = self.pass_budget.select(waiting_queue, self._need, self.clock())

    def _need(self, req: Req) -> Need:
        """A waiting request's uncached tokens over its cached prefix, by its last match."""
        matched = self.runner.state(req).matched
        return Need(len(req.origin_input_ids) - matched, matched)

    def chunk_budget(
        self, chunked_prefill_size: int | None, decoding: int, chunked_req: Req = None
    ) -> int | None:
        """This pass's chunked-prefill budget with `decoding` requests running (None: chunking off)
        and `chunked_req` (SGLang's chunked request, if one continues this pass). `decoding` is the
        running batch's size, less those `calc_priority` found finished."""
        config = self.config
        decoding -= self._finished_running
        self._riding = decoding if self.mixed_chunk else 0
        if chunked_prefill_size is None or self.between_slices:  # between slices: nobody is chunked
            self._plan = PassPlan(0)
            return None
        base = decode_adaptive_budget(
            chunked_prefill_size,
            decoding,
            config.decode_adaptive_budget,
            config.decode_budget_min_tokens,
            self.page_size,
        )
        if not self.pass_budget.enabled:
            self._plan = PassPlan(base)
            return base
        if chunked_req is not None:
            done = len(chunked_req.prefix_indices)
            long = Need(len(chunked_req.origin_input_ids) - done, done)
        else:
            after = self._waiting[len(self._shorts) : len(self._shorts) + 1]
            long = self._need(after[0]) if after else None
        # Under --enable-mixed-chunk the running requests' decode tokens ride the pass: PrefillAdder
        # takes them off the chunk budget, and they take their share of the pass time.
        riding = self._riding
        self._plan = self.pass_budget.plan(
            base, self.clock(), self._shorts, long, chunked_req is not None, riding
        )
        return self._plan.chunk + riding

    def add_chunked_req(self, adder: Adder, req: Req) -> Req | None:
        """`adder.add_chunked_req(req)`, its chunk capped by this pass's plan; the rest of the pass's
        budget stays for the requests the queue loop admits after it."""
        cap = self._long_cap(req)
        if cap is None or adder.rem_chunk_tokens is None:
            return adder.add_chunked_req(req)
        rest = adder.rem_chunk_tokens - cap
        adder.rem_chunk_tokens = cap
        try:
            left = adder.add_chunked_req(req)
        finally:
            adder.rem_chunk_tokens += rest
        self._chunk_continues = left is not None
        return left

    def _long_cap(self, req: Req) -> int | None:
        """The most tokens continuing chunked `req` may compute this pass (None: SGLang's budget)."""
        return self._plan.long_cap

    def _touch(self, req: Req) -> None:
        self.tree_cache.tree.touch(req.last_node)

    def _stamp(self, req: Req) -> tuple[int, int, Node, bool, int]:
        """Changes whenever `req`'s match may have: a match ending at node N grows only by a new child
        of N (an insert), and shrinks only by eviction; a reset bumps the epoch."""
        tree = self.tree_cache.tree
        node = req.last_node
        return (tree.epoch, tree.counters.evicted_tokens, node, node.alive, len(node.children))

    def defer(self, req: Req, adder: Adder) -> bool:
        """True when `req` waits this pass: its next uncached pages are being computed by an admitted
        request, or SGLang's chunked request continues after a capped chunk and `req` would not fit
        whole in the budget left (SGLang chunks one request at a time); between two layer slices of a
        lone prompt's pass, every request that is not short."""
        self._track(adder)
        if self.between_slices and self._uncached(req) > self.config.short_max_tokens:
            return True
        rem = adder.rem_chunk_tokens
        if self._chunk_continues and rem is not None and self._uncached(req) > rem:
            return True
        return self.runner.should_defer(req, self.position(req, len(req.full_untruncated_fill_ids)))

    @staticmethod
    def _uncached(req: Req) -> int:
        """What `req` computes this pass if admitted whole; read only under the 0.5.17-only chunk and
        slice hooks, so in 0.5.17's spelling."""
        return len(req.full_untruncated_fill_ids) - len(req.prefix_indices)

    def admitted(self, adder: Adder) -> None:
        """The pass's queue loop ended: track the last admissions, publish the counters."""
        self._track(adder)
        if self.metrics is not None:
            self._hit_tokens += adder.log_hit_tokens
            tree, runner = self.tree_cache.tree.counters, self.runner.counters
            self.metrics.publish(
                {
                    "hit_tokens": self._hit_tokens,
                    "evicted_tokens": tree.evicted_tokens,
                    "dedup_tokens": runner.dedup_tokens,
                    "deferrals": runner.deferrals,
                    "dedup_timeouts": runner.dedup_timeouts,
                    **dataclasses.asdict(self.pass_budget.counters),
                }
            )
        if self.pass_log is not None:
            self._log_pass(adder)

    def _log_pass(self, adder: Adder) -> None:
        cost, reqs, predicted = self.pass_budget.cost, [], 0.0
        for req in adder.can_run_list:
            start, end = len(req.prefix_indices), self._extend_end(req)
            reqs.append([end - start, start, int(end < len(req.full_untruncated_fill_ids))])
            predicted += cost.variable_ms(end - start, start)
        self.pass_log.write(
            PassRecord(
                t_ms=round(1e3 * self.clock(), 3),
                index=self.runner.counters.passes,
                waiting=len(self._waiting),
                shorts=len(self._shorts),
                budgeted=self._plan.budgeted,
                chunk=self._plan.chunk,
                predicted_ms=round(cost.fixed_ms + predicted, 3) if reqs else 0.0,
                reqs=reqs,
                riding=self._riding,
                synced=self._synced,
                between_slices=self.between_slices,
            )
        )

    def _track(self, adder: Adder) -> None:
        """Track the requests `adder` admitted since the last call, each as one flight."""
        if adder is not self._adder:
            self._adder, self._tracked = adder, 0
        for req in adder.can_run_list[self._tracked :]:
            end = self._chunk_end(req)
            tally = self._tallies.get(req)
            if tally is None:
                state = self.runner.waiting_states().get(req)
                tally = self._tallies[req] = RequestTally(state.passes - 1 if state is not None else 0)
            if self._plan.budgeted and end < len(req.full_untruncated_fill_ids):
                tally.budgeted_chunks += 1
            self.runner.track(req, self.position(req, end), end)
            deduped = self.runner.deduped_tokens(req)
            if deduped:
                tally.deduped_tokens = deduped
        self._tracked = len(adder.can_run_list)

    def _chunk_end(self, req: Req) -> int:
        """Where `req`'s admitted range ends; a version that can move a chunk's end moves it to
        `_aligned_end` here (0.5.17 does; elsewhere SGLang's own end stands)."""
        return self._extend_end(req)

    def _aligned_end(self, req: Req) -> int:
        """`req`'s chunk end aligned to pages and to a waiting request's divergence point."""
        end = self._extend_end(req)
        if end >= len(req.full_untruncated_fill_ids):
            return end  # not chunked: the whole rest of the prompt this pass
        ours = self.position(req, end)
        anchors = {self.tree_cache.tree.root, *req.last_node.path()}
        others = (
            # Its prompt: a waiting request's fill ids exist only once the admission loop reached it.
            dataclasses.replace(
                self.position(other, 0),
                tokens=as_token_array(other.origin_input_ids, len(other.origin_input_ids)),
            )
            for other in self._waiting
            if other is not req and other.last_node is not None
        )
        return aligned_chunk_end(
            ours.start,
            end,
            self.page_size,
            divergence_points(ours, end, others, anchors),
            self.config.chunk_align_tail,
        )

    def flushed(self) -> None:
        """The tree cache was reset: with fingerprints, a log line the doctor starts a new cache at
        (on the clock of SGLang's `time_stats`, which `start_ms` reads)."""
        if self.log is not None and self.config.log_fingerprints:
            self.log.write(FlushRecord(flush_ms=round(1e3 * time.perf_counter(), 3)))

    def _finish(self, req: Req) -> dict[str, int] | None:
        """`req` leaves: a version's own clean-up, and what its log line's `blend` says (None: nothing)."""
        return None

    def released(self, req: Req) -> None:
        """`req` finished or was aborted: its clean-up, then its log line."""
        blend = self._finish(req)
        if self.log is None:
            return
        stats = req.time_stats
        reason = req.finished_reason
        tally = self._tallies.pop(req, None) or RequestTally(0)
        record = RequestRecord(
            rid=req.rid,
            input_len=len(req.origin_input_ids),
            cached_tokens=req.cached_tokens,
            deduped_tokens=tally.deduped_tokens,
            chunks=req.extend_batch_idx,
            queue_passes=tally.queue_passes,
            budgeted_chunks=tally.budgeted_chunks,
            queue_ms=_ms(stats.wait_queue_entry_time, stats.forward_entry_time),
            prefill_ms=_ms(stats.forward_entry_time, stats.prefill_finished_time),
            ttft_ms=_ms(stats.wait_queue_entry_time, stats.prefill_finished_time),
            output_tokens=len(req.output_ids),
            error=getattr(reason, "message", None),
            blend=blend,
        )
        config = self.config
        if config.log_fingerprints:
            fp = fingerprint(req.origin_input_ids, config.fingerprint_block, config.fingerprint_salt)
            record = FingerprintedRecord(
                **dataclasses.asdict(record),
                start_ms=round(1e3 * stats.forward_entry_time, 3) if stats.forward_entry_time else -1.0,
                fp_block=config.fingerprint_block,
                fp=fp.blocks,
                fp_anchors=fp.anchors,
                fp_anchored=fp.anchored,
            )
        self.log.write(record)


S = TypeVar("S", bound=PrefillExtScheduler)


def build_scheduler(cls: type[S], scheduler: Any, owns_request_log: Callable[[Any], bool]) -> S | None:
    """`cls` for `scheduler` under `--enable-prefill-ext`, else None (stock scheduling); its tree
    cache keeps it as `prefill_ext_scheduler` too, for `released`.

    `owns_request_log(scheduler)`: this rank writes `--prefill-ext-log` (every TP / PP / CP rank
    schedules the same requests; one of them logs)."""
    server_args = scheduler.server_args
    config = common.prefill_ext_config(server_args)
    if config is None:
        return None
    if not owns_request_log(scheduler):
        config = dataclasses.replace(config, log=None)
    if config.tbt_target_ms > 0 and scheduler.chunked_prefill_size is not None:
        # Goodput scheduling: decodes ride every prefill pass (as under --enable-mixed-chunk).
        scheduler.is_mixed_chunk = True
    glue = cls(
        scheduler.policy,
        scheduler.tree_cache,
        config,
        scheduler.page_size,
        metrics=bool(getattr(server_args, "enable_metrics", False)),
        mixed_chunk=bool(getattr(scheduler, "is_mixed_chunk", False)),
    )
    scheduler.tree_cache.prefill_ext_scheduler = glue
    return glue


def released(req: Req, tree_cache: Any) -> None:
    """`release_kv_cache`'s hook (every finished or aborted request passes there): `req`'s clean-up
    and `--prefill-ext-log` line by the scheduler that owns `tree_cache` (none: the flag is off, so
    the cache is stock)."""
    glue = getattr(tree_cache, "prefill_ext_scheduler", None)
    if glue is not None:
        glue.released(req)
