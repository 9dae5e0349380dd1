"""SGLang 0.5.17's prefill scheduling, translated to the version-free `PrefillRunner`.

The patched `Scheduler` holds one `PrefillExtScheduler` (`prefill_ext_scheduler`, None with the flag
off; the patches import this module as `prefill_ext_scheduling`) and calls it at five points of
`_get_new_batch_prefill_raw`:

- `calc_priority(waiting_queue, running_batch)` in place of `SchedulePolicy.calc_priority`;
- `chunk_budget(chunked_prefill_size, running_bs, chunked_req)`: the pass's chunk size;
- `add_chunked_req(adder, chunked_req)` in place of `adder.add_chunked_req`: the continuing chunked
  request, its chunk capped by a pass budget;
- `defer(req, adder)` after `req.init_next_round_input`: True skips `req` this pass because its
  next uncached pages are in flight;
- `admitted(adder)` once the queue loop ends: tracks the last admissions, publishes the counters.

Its overlap event loop asks `forms_after_result(last_batch, running_batch, chunked_req)` before it
forms a batch: True processes the last batch's result first (and receives again), so a lone long
prompt's next chunk is formed after its running chunk, with the requests that arrived meanwhile.

Its normal event loop launches a batch with `run_batch(scheduler, batch)`: a lone long prompt's pass
in layer slices under `--prefill-ext-yield-layers` (`layer_yield.run_sliced`), else stock's `run_batch`.

The patched `release_kv_cache` (every finished or aborted request passes through it) calls
`released(req, tree_cache)`: the request's clean-up and `--prefill-ext-log` line, by the scheduler
that owns that tree cache.

Under `--prefill-ext-blend` (`blending.Blending`): `handle_generate_request` passes each new `Req`
to `received(scheduler, req, recv_req)`, which keeps its chunk spans. Before the adder takes a request
with spans, `defer` adds the tokens it would reuse to the chunk budget when only its computed tokens
fit. A request with spans is admitted blended when the queue loop admits it: admitted whole, it runs
in one pass (`blend_forward`, from the model forward's hook); else its extend is cut at its plan's
first computed run and it becomes the adder's chunked request; each later pass, `add_chunked_req`
first places the reused run its prefix ends at, then caps the extend at the next computed run's end.
SGLang chunks one request at a time, so a request whose plan needs more than one pass while another
is chunked is computed from its match on (its missed chunks still stored). `released` stores and
unlocks.

What 0.5.17 spells its own way (where a request's match ends, when its pages landed, how stock
matches a waiting request) is read here; the rest is `adapters.scheduling`, shared with 0.5.23, and
the decisions are the runner's. SGLang is imported lazily: `mem_cache/common.py` imports this
module while SGLang's own modules are still loading.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from sglang_prefill_ext.adapters import scheduling
from sglang_prefill_ext.config import OptionError, option_name
from sglang_prefill_ext.radix.tokens import as_token_array
from sglang_prefill_ext.runner import Flight, Position

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_prefill_ext.adapters.v0_5_17.blending import Blending
    from sglang_prefill_ext.blend.spans import Span

logger = logging.getLogger(__name__)


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


class PrefillExtScheduler(scheduling.PrefillExtScheduler):
    landed = staticmethod(landed)
    position = staticmethod(position)
    blending: Blending | None = None  # under --prefill-ext-blend
    _continuing: Req | None = None  # this pass's continuing chunked request, once added
    _credit: tuple[Req, int] | None = None  # reused tokens added to the chunk budget for a request

    @staticmethod
    def _extend_end(req: Req) -> int:
        return req.extend_range.end

    def add_chunked_req(self, adder: PrefillAdder, req: Req) -> Req | None:
        if self.blending is not None and self.blending.admission(req) is not None:
            self.blending.place_next(req)
        self._continuing = super().add_chunked_req(adder, req)
        return self._continuing

    def _long_cap(self, req: Req) -> int | None:
        cap = super()._long_cap(req)
        if self.blending is None or self.blending.admission(req) is None:
            return cap
        run = self.blending.extend_end(req) - len(req.prefix_indices)
        return run if cap is None else min(cap, run)

    def defer(self, req: Req, adder: PrefillAdder) -> bool:
        self._settle_credit(adder)
        if self.blending is not None and self.blending.one_pass:
            # before stock's checks: one that a chunked request continues measures the budget left
            self._credit_reused(req, adder)
        if super().defer(req, adder):
            self._settle_credit(adder)  # not taken this pass: the budget as it was
            return True
        return False

    def admitted(self, adder: PrefillAdder) -> None:
        self._settle_credit(adder)
        super().admitted(adder)
        self._continuing = None

    def _credit_reused(self, req: Req, adder: PrefillAdder) -> None:
        """Before `PrefillAdder` takes blendable `req`: if only its computed tokens fit the pass's chunk
        budget, add the tokens it would reuse to the budget, so that it is admitted whole and runs in
        one pass (the adder charges its whole extend; the pass computes the rest only)."""
        spans = self._blendable(req)
        rem = adder.rem_chunk_tokens
        extend = self._uncached(req)
        if spans is None or rem is None or extend <= rem:
            return
        reused = self.blending.reusable(req, spans)
        if reused and extend - reused <= rem:
            adder.rem_chunk_tokens += reused
            self._credit = (req, reused)

    def _settle_credit(self, adder: PrefillAdder) -> None:
        """After the adder's call on the credited request: it keeps the credit if admitted whole (its
        computed tokens charged), else the budget is what it was."""
        if self._credit is None:
            return
        req, reused = self._credit
        self._credit = None
        whole = any(r is req for r in adder.can_run_list) and req.extend_range.end == len(
            req.origin_input_ids
        )
        if not whole:
            adder.rem_chunk_tokens -= reused

    def _blendable(self, req: Req) -> tuple[Span, ...] | None:
        """`req`'s chunk spans if it may be blended (not one asking for its prompt's logprobs: the
        reused tokens' would be missing; SGLang sets the start past the prompt for output logprobs
        only)."""
        if req.return_logprob and 0 <= req.logprob_start_len < len(req.origin_input_ids):
            return None
        return self.blending.spans(req)

    def _chunk_end(self, req: Req) -> int:
        if self.blending is not None:
            self._admit_blended(req)
        end = self._aligned_end(req)
        if end != req.extend_range.end:
            req.set_extend_range(req.extend_range.start, end)
        return end

    def _admit_blended(self, req: Req) -> None:
        """Just admitted, blendable `req` runs its blend plan: in this one pass where SGLang admitted
        its whole prompt and the backend can (`Blending.pend`); else its extend cut at the first
        computed run's end, it becomes the adder's chunked request; computed whole where it cannot
        (another request is chunked this pass)."""
        blending, adder = self.blending, self._adder
        spans = self._blendable(req)
        if spans is None or blending.admission(req) is not None:
            return
        blending.admit(req, spans)
        start, end = req.extend_range.start, req.extend_range.end
        if blending.one_pass and end == len(req.origin_input_ids):
            blending.pend(req)
            return
        cut = blending.extend_end(req)
        if cut >= end:
            return
        if self._continuing is None and adder.new_chunked_req in (None, req):
            req.set_extend_range(start, cut)
            adder.new_chunked_req = req
            self._chunk_continues = True  # later requests this pass must not be chunked
        else:
            blending.compute_from(req, start)

    def _finish(self, req: Req) -> dict[str, int] | None:
        if self.blending is None:
            return None
        counts = self.blending.finish(req, completed=bool(req.output_ids))
        return None if counts is None else dataclasses.asdict(counts)

    def _match(self, req: Req) -> int:
        from sglang.srt.managers.schedule_policy import match_prefix_for_req

        match_prefix_for_req(self.tree_cache, req, include_req=True)
        return req.num_matched_prefix_tokens


def _owns_request_log(scheduler: Scheduler) -> bool:
    """Every TP / PP / CP rank schedules the same requests: one of them writes `--prefill-ext-log`.

    A scheduler without parallel state (a single-process replay) is its own only rank."""
    ps = getattr(scheduler, "ps", None)
    return ps is None or (ps.attn_tp_rank == 0 and ps.pp_rank == 0 and ps.attn_cp_rank == 0)


def build(scheduler: Scheduler) -> PrefillExtScheduler | None:
    """The scheduler's `PrefillExtScheduler` under `--enable-prefill-ext`, else None (stock scheduling).
    OptionError where `--prefill-ext-yield-layers` meets a model without a split prefill (a scheduler
    without a model, the CPU replay's, is not checked)."""
    glue = scheduling.build_scheduler(PrefillExtScheduler, scheduler, _owns_request_log)
    model = getattr(scheduler.tp_worker.model_runner, "model", None)
    if glue is None or model is None:
        return glue
    if glue.config.yield_layers and not hasattr(model, "forward_split_prefill"):
        raise OptionError(
            f"{option_name('yield_layers')}: {type(model).__name__} has no forward_split_prefill"
        )
    if glue.config.blend:
        from sglang_prefill_ext.adapters.v0_5_17.blend_forward import refusal
        from sglang_prefill_ext.adapters.v0_5_17.blending import Blending, rope_of

        pool = scheduler.token_to_kv_pool_allocator.get_kvcache()
        why = refusal(scheduler.tp_worker.model_runner.attn_backend, glue.config)
        if why is not None:
            logger.warning("%s: one forward pass per computed run on %s", option_name("blend"), why)
        glue.blending = Blending(
            scheduler.tree_cache, pool, rope_of(model), glue.config.blend_recompute_ratio, why is None
        )
    return glue


def received(scheduler: Scheduler, req: Req, recv_req: TokenizedGenerateReqInput) -> None:
    """`handle_generate_request` made `req`: under --prefill-ext-blend, keep its chunk spans."""
    glue = scheduler.prefill_ext_scheduler
    if glue is not None and glue.blending is not None:
        glue.blending.mark(req, recv_req.chunk_spans)


def run_batch(scheduler: Scheduler, batch: ScheduleBatch) -> Any:
    """The normal event loop's launch of `batch`: in layer slices where the extension's scheduler
    says so (`PrefillExtScheduler.slices`), else `scheduler.run_batch(batch)`.

    A sliced batch is the scheduler's `last_batch` from its first slice on (the loop makes it so once
    it returns): the requests received between its slices must find it in flight, as stock's next
    receive finds the batch it launched. Else its request, in no queue or batch SGLang looks at, is
    lost to an abort (`abort_request`: the running and last batches) and, with nothing else running
    or waiting, `is_fully_idle` holds, so a `/flush_cache` clears the pools under it."""
    glue = scheduler.prefill_ext_scheduler
    if glue is None or not glue.slices(batch, scheduler.running_batch):
        return scheduler.run_batch(batch)
    from sglang_prefill_ext.adapters.v0_5_17.layer_yield import ServerEngine, run_sliced

    scheduler.last_batch = batch
    return run_sliced(scheduler, glue, batch, ServerEngine(scheduler))


released = scheduling.released
