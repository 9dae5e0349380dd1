"""A lone long prompt's pass run in layer slices, yielding between them (--prefill-ext-yield-layers).

SGLang 0.5.17 runs an extend batch as `ForwardMode.SPLIT_PREFILL`, layers `[split_index, split_index +
split_forward_count)` per forward, keeping the batch's `ForwardBatch` between forwards (`--enable-pdmux`
uses it). `run_sliced` runs the sliced batch that way; after each slice but the last it receives
requests and runs one pass of the scheduler's own (`between_slices`): a batch of the short requests
waiting (nothing else is admitted, nothing chunked; SGLang's chunked request is hidden while it forms,
so the sliced one is neither cached nor continued), else a decode step of the running batch. The
sliced request holds its chunk's KV slots throughout (its prefix stays locked in the tree, so a pass
between slices that evicts cannot take it) and its batch stays out of the running batch until its last
slice, whose result is the pass's. A pass run between two slices overwrote the attention backend's
per-batch metadata, so the next slice re-initializes it.

What runs the forwards and processes the results is a `SliceEngine`: `ServerEngine` on the server
(the normal event loop's own calls), the CPU replay's on a simulated clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from sglang_prefill_ext.runner.layer_slices import layer_slices

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_prefill_ext.adapters.scheduling import PrefillExtScheduler


class SliceEngine(Protocol):
    running_batch: ScheduleBatch  # the requests decoding

    def forward_slice(self, batch: ScheduleBatch, reinit: bool) -> Any:
        """Run `batch`'s next layer slice (its `split_index`, `split_forward_count`), its attention
        metadata re-initialized first when `reinit`; its result (the last slice's is the pass's)."""

    def receive(self) -> None:
        """Receive the requests that arrived."""

    def run_pass(self, batch: ScheduleBatch) -> None:
        """Run prefill batch `batch` whole and process its result."""

    def decode_step(self) -> bool:
        """Run a decode step of the running batch and process its result; False when nobody decodes."""


def run_sliced(
    scheduler: Scheduler, glue: PrefillExtScheduler, batch: ScheduleBatch, engine: SliceEngine
) -> Any:
    """Run `batch` in slices of `--prefill-ext-yield-layers` layers, one pass of the scheduler's own
    between two slices where one forms; the last slice's result, `batch` an extend batch again."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    layers = scheduler.model_config.num_hidden_layers
    batch.forward_mode, batch.split_index = ForwardMode.SPLIT_PREFILL, 0
    reinit = False
    for start, end in layer_slices(layers, glue.config.yield_layers):
        batch.split_forward_count = end - start
        result = engine.forward_slice(batch, reinit)
        batch.split_index = end
        reinit = end < layers and between_slices(scheduler, glue, engine)
    batch.forward_mode, batch.split_index, batch.split_forward_batch = ForwardMode.EXTEND, 0, None
    return result


def between_slices(scheduler: Scheduler, glue: PrefillExtScheduler, engine: SliceEngine) -> bool:
    """Receive, then run one pass if one forms: the waiting short requests (with the decodes riding
    under mixed chunk), else a decode step. True when a pass ran."""
    engine.receive()
    hidden, scheduler.chunked_req = scheduler.chunked_req, None
    glue.between_slices = True
    try:
        plan = scheduler.get_new_batch_prefill(engine.running_batch)
    finally:
        glue.between_slices = False
        scheduler.chunked_req = hidden
    engine.running_batch = plan.running_batch
    batch = plan.batch_to_run
    if batch is None:
        return engine.decode_step()
    engine.run_pass(batch)
    _join(engine, batch)
    return True


def _join(engine: SliceEngine, batch: ScheduleBatch) -> None:
    """`get_next_batch_to_run`'s merge of a prefill batch into the running batch (none is chunked)."""
    batch.filter_batch()
    if batch.is_empty():
        return
    if engine.running_batch.is_empty():
        engine.running_batch = batch
    else:
        engine.running_batch.merge_batch(batch)


class ServerEngine:
    """The normal event loop's calls on `scheduler`: `run_batch` (its split-prefill branch for a slice),
    `process_batch_result`, the request receiver."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @property
    def running_batch(self) -> ScheduleBatch:
        return self.scheduler.running_batch

    @running_batch.setter
    def running_batch(self, batch: ScheduleBatch) -> None:
        self.scheduler.running_batch = batch

    def forward_slice(self, batch: ScheduleBatch, reinit: bool) -> Any:
        if reinit:  # what `forward_split_prefill(reinit_attn_backend=True)` does
            self.scheduler.tp_worker.model_runner.attn_backend.init_forward_metadata(
                batch.split_forward_batch
            )
        return self.scheduler.run_batch(batch)

    def receive(self) -> None:
        s = self.scheduler
        s.process_input_requests(s.request_receiver.recv_requests())

    def run_pass(self, batch: ScheduleBatch) -> None:
        self.scheduler.process_batch_result(batch, self.scheduler.run_batch(batch))

    def decode_step(self) -> bool:
        """`get_next_batch_to_run`'s decode step (retracting where the pool runs short)."""
        s = self.scheduler
        if s.running_batch.is_empty() or s.running_batch.is_prefill_only:
            return False
        s.running_batch = s.update_running_batch(s.running_batch)
        if s.running_batch.is_empty():
            return False
        self.run_pass(s.running_batch)
        return True
