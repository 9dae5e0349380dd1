"""SGLang 0.5.23's prefill scheduling, translated to the version-free `PrefillRunner`.

The patched `Scheduler` holds one `PrefillExtScheduler` (`prefill_ext_scheduler`, None with the flag
off) and calls it where 0.5.17's does (`patches/sglang-0.5.23/0003-scheduler.patch`, imported
there as `prefill_ext_scheduling`): in place of
`SchedulePolicy.calc_priority` (which 0.5.23 also passes `processed_tokens`), `defer(req, adder)`
after `req.init_next_round_input(tree_cache)`, `admitted(adder)` after the queue loop, and
`released(req, tree_cache)` in `release_kv_cache` (the `--prefill-ext-log` line).

What 0.5.23 spells differently from 0.5.17, all read here: a request's KV state lives in `req.kv`
(`holds_kv`, `cache_protected_len`: what the tree owns after `checkpoint`), its match in
`req.prefix_len` and its chunk end in `req.extend_end`; keys carry `cache_salt` (the namespace, as in
the tree); stock matches a waiting request with `match_kv_cache`; ranks come from `get_parallel()`.
SGLang is imported lazily: `mem_cache/common.py` imports this module while SGLang's own modules
are still loading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_prefill_ext.adapters import scheduling
from sglang_prefill_ext.adapters.v0_5_23.keys import namespace
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.runner import Flight, Position

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler


class PrefillExtScheduler(scheduling.PrefillExtScheduler):
    @staticmethod
    def landed(flight: Flight) -> bool:
        req: Req = flight.producer
        return (
            req.finished()
            or not req.kv.holds_kv
            or req.is_retracted
            or req.kv.cache_protected_len >= flight.end
        )

    @staticmethod
    def position(req: Req, length: int) -> Position:
        tokens = as_token_array(req.full_untruncated_fill_ids, length)
        return Position(namespace(req.extra_key, req.cache_salt), req.last_node, tokens, req.prefix_len)

    @staticmethod
    def _extend_end(req: Req) -> int:
        return req.extend_end

    def _match(self, req: Req) -> int:
        from sglang.srt.mem_cache.common import match_kv_cache

        match_kv_cache(req, self.tree_cache, req.origin_input_ids + req.output_ids)
        return req.num_matched_prefix_tokens


def _owns_request_log(scheduler: Scheduler) -> bool:
    """Every TP / PP / CP rank schedules the same requests: the first writes `--prefill-ext-log`."""
    from sglang.srt.runtime_context import get_parallel

    ranks = get_parallel()
    return ranks.attn_tp_rank == 0 and ranks.pp_rank == 0 and ranks.attn_cp_rank == 0


def build(scheduler: Scheduler) -> PrefillExtScheduler | None:
    """The scheduler's `PrefillExtScheduler` under `--enable-prefill-ext`, else None (stock scheduling)."""
    return scheduling.build_scheduler(PrefillExtScheduler, scheduler, _owns_request_log)


released = scheduling.released
