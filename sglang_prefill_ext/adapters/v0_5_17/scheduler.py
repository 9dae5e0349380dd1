"""SGLang 0.5.17's prefill scheduling, translated to the version-free `PrefillRunner`.

The patched `Scheduler` holds one `PrefillExtScheduler` (`prefill_ext_runner`, None with the flag
off) and calls it at three points of `_get_new_batch_prefill_raw`:

- `calc_priority(waiting_queue, running_batch)` in place of `SchedulePolicy.calc_priority`;
- `defer(req, adder)` after `req.init_next_round_input`: True skips `req` this pass because its
  next uncached pages are in flight;
- `admitted(adder)` once the queue loop ends: tracks the last admissions, publishes the counters.

With `--prefill-ext-log`, the patched `release_kv_cache` (every finished or aborted request passes
through it) calls `REQUEST_LOG.released(req)`.

Everything SGLang-specific (where a request's match ends, when its pages landed) is read here;
the decisions are the runner's. SGLang is imported lazily: `mem_cache/common.py` imports this
module while SGLang's own modules are still loading.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING

from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.radix.node import Node
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.runner import Flight, Position, PrefillRunner
from sglang_prefill_ext.runner.metrics import CounterDeltas
from sglang_prefill_ext.runner.request_log import JsonlLog, RequestRecord

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_prefill_ext.adapters.v0_5_17.radix_cache import PrefillExtRadixCache

# The scheduler whose `--prefill-ext-log` the patched `release_kv_cache` feeds (None: no log).
REQUEST_LOG: PrefillExtScheduler | None = None


def landed(flight: Flight) -> bool:
    """The producer's pages are in the tree, or it stopped computing them (finished, aborted, retracted)."""
    req: Req = flight.producer
    return (
        req.finished()
        or req.req_pool_idx is None
        or req.is_retracted
        or (req.cache_protected_len or 0) >= flight.end
    )


def position(req: Req, length: int) -> Position:
    """Where `req`'s match ends (its first `length` tokens as a transient int64 view)."""
    tokens = as_token_array(req.full_untruncated_fill_ids, length)
    return Position(req.extra_key, req.last_node, tokens, len(req.prefix_indices))


def _ms(start: float, end: float) -> float:
    return round(1e3 * (end - start), 3) if start and end else -1.0


class PrefillExtScheduler:
    def __init__(
        self,
        policy: SchedulePolicy,
        tree_cache: PrefillExtRadixCache,
        config: PrefillExtConfig,
        page_size: int,
        metrics: bool = False,
    ) -> None:
        from sglang.srt.managers.schedule_policy import CacheAwarePolicy, match_prefix_for_req

        self.policy = policy
        self.tree_cache = tree_cache
        self._match_prefix = match_prefix_for_req
        schedule = config.schedule
        if schedule == "auto":
            schedule = "lpm-aging" if policy.policy == CacheAwarePolicy.LPM else "stock"
        self.schedule = schedule
        self.runner = PrefillRunner(
            page_size,
            dedup=config.dedup,
            min_shared_tokens=config.dedup_min_tokens,
            max_dedup_passes=config.dedup_max_wait_passes,
            max_wait_passes=config.max_wait_passes,
        )
        self.log = JsonlLog(config.log) if config.log else None
        self.metrics = CounterDeltas() if metrics else None
        self._hit_tokens = 0
        self._deduped: weakref.WeakKeyDictionary[Req, int] = weakref.WeakKeyDictionary()
        self._adder: PrefillAdder | None = None
        self._tracked = 0

    def calc_priority(self, waiting_queue: list[Req], running_batch: ScheduleBatch | None = None) -> None:
        self.runner.begin_pass(waiting_queue, landed)
        self._adder, self._tracked = None, 0
        if self.schedule == "stock":
            self.policy.calc_priority(waiting_queue, running_batch)
            return
        self.runner.order(waiting_queue, self._stamp, self._match)
        if self.policy.enable_priority_scheduling:
            sign = self.policy.priority_sign
            waiting_queue.sort(key=lambda r: r.priority * sign)

    def _stamp(self, req: Req) -> tuple[int, int, Node, bool, int]:
        """Changes whenever `req`'s match may have: a match ending at node N grows only by a new child
        of N (an insert), and shrinks only by eviction; a reset bumps the epoch."""
        tree = self.tree_cache.tree
        node = req.last_node
        return (tree.epoch, tree.counters.evicted_tokens, node, node.alive, len(node.children))

    def _match(self, req: Req) -> int:
        self._match_prefix(self.tree_cache, req, include_req=True)
        return req.num_matched_prefix_tokens

    def defer(self, req: Req, adder: PrefillAdder) -> bool:
        """True when `req`'s next uncached pages are being computed by an admitted request."""
        self._track(adder)
        return self.runner.should_defer(req, position(req, len(req.full_untruncated_fill_ids)))

    def admitted(self, adder: PrefillAdder) -> None:
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
                }
            )

    def _track(self, adder: PrefillAdder) -> None:
        """Track the requests `adder` admitted since the last call, each as one flight."""
        if adder is not self._adder:
            self._adder, self._tracked = adder, 0
        for req in adder.can_run_list[self._tracked :]:
            self.runner.track(req, position(req, req.extend_range.end), req.extend_range.end)
            deduped = self.runner.deduped_tokens(req)
            if deduped:
                self._deduped[req] = deduped
        self._tracked = len(adder.can_run_list)

    def released(self, req: Req) -> None:
        """`req` finished or was aborted: its log line."""
        stats = req.time_stats
        reason = req.finished_reason
        self.log.write(
            RequestRecord(
                rid=req.rid,
                input_len=len(req.origin_input_ids),
                cached_tokens=req.cached_tokens,
                deduped_tokens=self._deduped.pop(req, 0),
                chunks=req.extend_batch_idx,
                queue_ms=_ms(stats.wait_queue_entry_time, stats.forward_entry_time),
                prefill_ms=_ms(stats.forward_entry_time, stats.prefill_finished_time),
                ttft_ms=_ms(stats.wait_queue_entry_time, stats.prefill_finished_time),
                output_tokens=len(req.output_ids),
                error=getattr(reason, "message", None),
            )
        )


def _owns_request_log(scheduler: Scheduler) -> bool:
    """Every TP / PP / CP rank schedules the same requests: one of them writes `--prefill-ext-log`.

    A scheduler without parallel state (a single-process replay) is its own only rank."""
    ps = getattr(scheduler, "ps", None)
    return ps is None or (ps.attn_tp_rank == 0 and ps.pp_rank == 0 and ps.attn_cp_rank == 0)


def build(scheduler: Scheduler) -> PrefillExtScheduler | None:
    """The scheduler's runner under `--enable-prefill-ext`, else None (stock scheduling)."""
    global REQUEST_LOG
    REQUEST_LOG = None
    server_args = scheduler.server_args
    if not getattr(server_args, "enable_prefill_ext", False):
        return None
    config = PrefillExtConfig.from_options(server_args.prefill_ext_options)
    if not _owns_request_log(scheduler):
        config = dataclasses.replace(config, log=None)
    runner = PrefillExtScheduler(
        scheduler.policy,
        scheduler.tree_cache,
        config,
        scheduler.page_size,
        metrics=bool(getattr(server_args, "enable_metrics", False)),
    )
    if runner.log is not None:
        REQUEST_LOG = runner
    return runner
