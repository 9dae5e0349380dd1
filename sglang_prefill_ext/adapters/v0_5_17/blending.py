"""Chunk blending's steps on SGLang 0.5.17's chunked prefill (docs/BLEND.md, "Serving").

A blended request runs its prompt in one forward pass when SGLang admitted all of it at once and the
backend can (`one_pass`; `blend_forward`), else as its plan's extends, one pass each, as SGLang's
chunked request. The scheduler adapter (`scheduler.PrefillExtScheduler`) calls these, per request:

- `mark(req, spans)` when the scheduler makes the `Req` (`handle_generate_request`);
- `admit(req, spans)` once `PrefillAdder` admitted it (its prefix matched): look up, plan, lock
  (`adapters.blend.plan_of`, `lock`); from then on the tree takes only its first `exact_len` tokens;
- `pend(req)`: admitted whole, it runs in one pass; the model forward's hook `take`s it and
  `place_all` writes its reused runs into the slots SGLang allocated for its whole extend;
- `extend_end(req)`: where its extend from `len(req.prefix_indices)` may end at most, the end of the
  computed run that holds that position (the adder's extend is capped to it);
- `compute_from(req, position)`: everything from `position` on computed (no reuse there), for a
  request that cannot run as SGLang's one chunked request;
- `place_next(req)` between passes, after `cache_unfinished_req`: when the prefix ends where a reused
  run starts, that run gets slots of its own in the request's row, its KV is placed there, and it
  joins `prefix_indices` (the next extend's prefix) and the request's committed KV, so an abort frees
  it with the rest (`release_kv_cache`). A pool too short for the run leaves it to be computed;
- `finish(req, completed)` before `release_kv_cache`: the spans that missed are stored once the
  prefill completed (an aborted prefill's KV is not), and the reused entries are unlocked.

Page size 1 only: on a paged allocator a placed run would have to continue the prefix's last page.
`rope_of(model)` reads the RoPE the model's attention applies, for re-rotating reused keys.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from sglang_prefill_ext.adapters import blend
from sglang_prefill_ext.blend.plan import BlendCounts, Run
from sglang_prefill_ext.blend.spans import Span
from sglang_prefill_ext.config import OptionError, option_name
from sglang_prefill_ext.ops.rope import Rope, Yarn
from sglang_prefill_ext.radix.tokens import as_token_array

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

    from sglang_prefill_ext.adapters.v0_5_17.radix_cache import PrefillExtRadixCache


class Blending:
    """The blended requests of one scheduler, over its tree cache and its KV pool."""

    def __init__(
        self, cache: PrefillExtRadixCache, pool: Any, rope: Rope, ratio: float, one_pass: bool = False
    ) -> None:
        if cache.page_size != 1:
            raise ValueError(f"--prefill-ext-blend needs --page-size 1 for now (got {cache.page_size})")
        blend.check_pool(pool)
        self.cache, self.pool, self.rope, self.ratio = cache, pool, rope, ratio
        self.one_pass = one_pass  # the model forward can run a request's computed runs as one batch
        self._admissions: weakref.WeakKeyDictionary[Req, blend.BlendAdmission] = weakref.WeakKeyDictionary()
        self._pending: weakref.WeakSet[Req] = weakref.WeakSet()
        self._spans: weakref.WeakKeyDictionary[Req, tuple[Span, ...]] = weakref.WeakKeyDictionary()

    def mark(self, req: Req, spans: Any) -> None:
        """`req`'s checked chunk spans (`TokenizedGenerateReqInput.chunk_spans`, lists after IPC)."""
        if spans:
            self._spans[req] = tuple((int(start), int(end)) for start, end in spans)

    def spans(self, req: Req) -> tuple[Span, ...] | None:
        return self._spans.get(req)

    def admission(self, req: Req) -> blend.BlendAdmission | None:
        return self._admissions.get(req)

    def admit(self, req: Req, spans: tuple[Span, ...]) -> blend.BlendAdmission:
        """Plan `req`'s prompt past its matched prefix and lock the chunks the plan reuses."""
        admission = blend.lock(self.cache, self._plan(req, spans))
        self._admissions[req] = admission
        self.cache.exact_lens[req] = admission.exact_len
        return admission

    def reusable(self, req: Req, spans: tuple[Span, ...]) -> int:
        """How many tokens `admit` would reuse for waiting `req` now (its match as it stands)."""
        return self._plan(req, spans).plan.reused_tokens

    def _plan(self, req: Req, spans: tuple[Span, ...]) -> blend.BlendAdmission:
        """`req`'s plan past its match as it stands, nothing locked (`blend.plan_of`)."""
        tokens = as_token_array(req.origin_input_ids, len(req.origin_input_ids)).copy()
        return blend.plan_of(self.cache, tokens, req.extra_key, spans, len(req.prefix_indices), self.ratio)

    def pend(self, req: Req) -> None:
        """`req`, admitted with its whole prompt past the match, runs in one pass if it reuses anything."""
        if self._admissions[req].plan.reused_tokens:
            self._pending.add(req)

    def take(self, req: Req) -> blend.BlendAdmission | None:
        """`req`'s admission if it waits for its one pass (once: the pass is this one), else None."""
        if req not in self._pending:
            return None
        self._pending.discard(req)
        return self._admissions[req]

    def place_all(self, req: Req) -> None:
        """Every reused run of `req`'s plan into its slots (allocated with its extend); SGLang's count
        of its cached tokens takes them, as it takes a placed run's in `place_next`."""
        admission = self._admissions[req]
        blend.place(
            self.pool, self.rope, admission, self.cache.req_to_token_pool.req_to_token[req.req_pool_idx]
        )
        if not req.retracted_stain:  # SGLang counts a retracted request's cached tokens once
            req.cached_tokens += admission.plan.reused_tokens

    def _run_at(self, req: Req) -> Run | None:
        """The run of `req`'s plan that holds its first position past `prefix_indices`."""
        done = len(req.prefix_indices)
        return next((run for run in self._admissions[req].plan.runs if run.start <= done < run.end), None)

    def extend_end(self, req: Req) -> int:
        """The furthest `req`'s next extend may reach: the end of its computed run (or the prompt's)."""
        run = self._run_at(req)
        return len(req.origin_input_ids) if run is None or run.reused else run.end

    def compute_from(self, req: Req, position: int) -> None:
        """`req`'s plan with everything from `position` (a run's start) on computed."""
        admission = self._admissions[req]
        admission.plan = admission.plan.computed_from(position)
        self.cache.exact_lens[req] = admission.exact_len

    def place_next(self, req: Req) -> bool:
        """Between passes: the reused run at `req`'s prefix end into slots of its own; False if there
        is none there, or the pool cannot hold it (that run and the rest are then computed)."""
        run = self._run_at(req)
        if run is None or not run.reused:
            return False
        admission = self._admissions[req]
        length = run.end - run.start
        allocator = self.cache.token_to_kv_pool_allocator
        if allocator.available_size() < length:
            self.cache.evict(EvictParams(num_tokens=length - allocator.available_size()))
        slots = allocator.alloc(length)
        if slots is None:
            self.compute_from(req, run.start)
            return False
        slots = slots.to(torch.int64)
        pool = self.cache.req_to_token_pool
        pool.write((req.req_pool_idx, slice(run.start, run.end)), slots.to(pool.req_to_token.dtype))
        blend.place_run(self.pool, self.rope, admission, run, pool.req_to_token[req.req_pool_idx])
        req.prefix_indices = torch.cat([req.prefix_indices.to(torch.int64), slots])
        req.kv.kv_allocated_len = run.end
        req.kv_committed_len = run.end
        return True

    def finish(self, req: Req, completed: bool) -> BlendCounts | None:
        """Store the spans that missed (when `completed`), unlock the reused ones; what the plan did
        with the chunk tokens (None: `req` was not admitted blended)."""
        self._pending.discard(req)
        admission = self._admissions.pop(req, None)
        if admission is None:
            return None
        if completed:
            row = self.cache.req_to_token_pool.req_to_token[req.req_pool_idx]
            blend.store(self.cache, self.pool, admission, row)
        blend.release(self.cache, admission)
        return admission.plan.counts(admission.spans)


def rope_of(model: Any) -> Rope:
    """The RoPE of `model`'s attention (its first rotary module): plain or YaRN over the whole head,
    neox layout. OptionError, by name, for any other (blending could not re-rotate its keys)."""
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.layers.rotary_embedding.yarn import YaRNScalingRotaryEmbedding

    rotary = next((m for m in model.modules() if isinstance(m, RotaryEmbedding)), None)
    flag = option_name("blend")
    if rotary is None or type(rotary) not in (RotaryEmbedding, YaRNScalingRotaryEmbedding):
        raise OptionError(f"{flag} re-rotates plain and YaRN RoPE only, not {type(rotary).__name__}")
    if rotary.rotary_dim != rotary.head_size or not rotary.is_neox_style:
        raise OptionError(f"{flag} re-rotates RoPE over the whole head in the neox layout only")
    yarn = None
    if isinstance(rotary, YaRNScalingRotaryEmbedding):
        yarn = Yarn(
            rotary.scaling_factor,
            rotary.max_position_embeddings,
            rotary.beta_fast,
            rotary.beta_slow,
            rotary.extrapolation_factor,
            rotary.truncate,
        )
    return Rope(rotary.head_size, float(rotary.base), yarn)
