"""A lone long prompt's next chunk formed after its running chunk (--prefill-ext-lone-chunk-sync): the
patched overlap loop of the installed SGLang, and the policy on its real scheduler (CPU pools, simulated
clock from bench.replay.mixed_replay), KV accounting checked every pass."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType, SimpleNamespace

import pytest

from sglang_prefill_ext.config import PrefillExtConfig
from sglang_prefill_ext.patching import PatchSet
from sglang_prefill_ext.runner.pass_cost import PassCost
from tests.runner.conftest import lone_prompt, ported

COST = PassCost()
GOODPUT = ("--prefill-ext-tbt-target-ms", "100")
PRESYNC = (*GOODPUT, "--prefill-ext-lone-chunk-sync", "false")


class Batch:
    """A batch the loop launches: only its name matters here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def copy(self) -> Batch:
        return self

    def __repr__(self) -> str:
        return self.name


class Loop:
    """What `Scheduler.event_loop_overlap` reads of its scheduler, each call it makes logged; it forms
    `batches` one an iteration, then stops. `drain_after`: the batches the extension's hook answers True
    for (None: the flag is off, no hook)."""

    def __init__(self, batches: Iterable[Batch], drain_after: set[str] | None) -> None:
        self.events: list[str] = []
        self._batches = list(batches)
        self.gracefully_exit = self._engine_paused = self.enable_unified_memory = self.is_generation = False
        self.last_batch = None
        self.running_batch = self.chunked_req = None
        self.request_receiver = SimpleNamespace(recv_requests=self._recv)
        self.prefill_ext_scheduler = (
            None
            if drain_after is None
            else SimpleNamespace(forms_after_result=lambda last, *_: str(last) in drain_after)
        )

    def _recv(self) -> list[object]:
        self.events.append("recv")
        return []

    def process_input_requests(self, reqs: list[object]) -> None:
        pass

    def get_next_batch_to_run(self, running_batch: object, last_batch: object) -> SimpleNamespace:
        batch = self._batches.pop(0) if self._batches else None
        self.gracefully_exit = batch is None
        self.events.append(f"form {batch}")
        return SimpleNamespace(running_batch=running_batch, batch_to_run=batch)

    def is_disable_overlap_for_batch(self, batch: object, last_batch: object) -> bool:
        return False

    def run_batch(self, batch: Batch) -> str:
        self.events.append(f"launch {batch}")
        return f"result {batch}"

    def _apply_war_barrier(self) -> None:
        pass

    def process_batch_result(self, batch: Batch, result: str) -> None:
        self.events.append(f"process {batch}")

    def on_idle(self) -> None:
        pass


def loop_events(drain_after: set[str] | None) -> list[str]:
    from sglang.srt.managers.scheduler import Scheduler

    loop = Loop([Batch("A"), Batch("B"), Batch("C")], drain_after)
    Scheduler.event_loop_overlap(loop)  # type: ignore[arg-type]
    return loop.events


@ported("tbt_target_ms")
def test_the_patched_overlap_loop_forms_the_next_batch_after_a_lone_chunks_result(
    patched_sglang: PatchSet,
) -> None:
    """Stock forms B while A runs and processes A's result after launching B. Where the hook answers
    True for A, A's result comes first, then the requests that arrived while it ran, then B: each
    result processed once, the loop overlapped again after B."""
    stock = ["recv", "form A", "launch A"]
    stock += ["recv", "form B", "launch B", "process A"]
    stock += ["recv", "form C", "launch C", "process B"]
    stock += ["recv", "form None", "process C"]
    assert loop_events(None) == loop_events(set()) == stock
    synced = ["recv", "form A", "launch A"]
    synced += ["recv", "process A", "recv", "form B", "launch B"]
    synced += ["recv", "form C", "launch C", "process B"]
    synced += ["recv", "form None", "process C"]
    assert loop_events({"A"}) == synced


def test_the_flag_is_on_by_default_and_reads_false() -> None:
    assert PrefillExtConfig().lone_chunk_sync
    assert not PrefillExtConfig.from_options({"lone_chunk_sync": "false"}).lone_chunk_sync


def timed(
    mixed: ModuleType, replay: ModuleType, trace: list, ext: bool, extra: tuple[str, ...] = ()
) -> object:
    config = replay.ReplayConfig(
        ext=ext, chunked_prefill_size=8192, pool_tokens=1 << 18, overlap=True, extra_args=extra
    )
    return mixed.run_timed(trace, config, COST, check_kv=True)


@ported("tbt_target_ms")
def test_shorts_arriving_mid_chunk_ride_the_very_next_pass(replay: ModuleType, mixed: ModuleType) -> None:
    """The H200's worst mixed shorts: two arriving 22 and 40 ms into a 32K prompt's first 8K chunk.
    With the next chunk formed ahead they wait for it too (a second full chunk); synced, they ride the
    pass right after the first, no decode skipped afterwards."""
    trace = lone_prompt(mixed, replay, 32768, [22.0, 40.0])
    first = COST.fixed_ms + COST.variable_ms(8192, 0)
    second = COST.fixed_ms + COST.variable_ms(8192, 8192)
    ahead = timed(mixed, replay, trace, True, PRESYNC)
    synced = timed(mixed, replay, trace, True, GOODPUT)
    assert ahead.kv_errors == synced.kv_errors == []
    for rid, arrival in (("s0", 22.0), ("s1", 40.0)):
        assert ahead.ttft_ms[rid] > first - arrival + second
        assert synced.ttft_ms[rid] < first - arrival + mixed.SYNC_GAP_MS + 100.0
    for rid, passes in synced.token_passes.items():
        assert passes == list(range(passes[0], passes[0] + len(passes))), rid


@ported("tbt_target_ms")
@pytest.mark.parametrize("tokens", [8192, 32768])
def test_a_lone_prompt_keeps_stocks_full_chunks(replay: ModuleType, mixed: ModuleType, tokens: int) -> None:
    """Alone it runs stock's chunks and pays one scheduling gap per chunk boundary: within 1 % of stock
    at the gap's estimate. Without the goodput flag the loop is stock's."""
    trace = lone_prompt(mixed, replay, tokens, [])
    stock = timed(mixed, replay, trace, False, ("--enable-mixed-chunk",))
    synced = timed(mixed, replay, trace, True, GOODPUT)
    plain_ext = timed(mixed, replay, trace, True)
    assert synced.chunks == stock.chunks == {"long": tokens // 8192}
    gaps = (tokens // 8192 - 1) * mixed.SYNC_GAP_MS
    assert synced.ttft_ms["long"] == pytest.approx(stock.ttft_ms["long"] + gaps)
    assert synced.ttft_ms["long"] <= 1.01 * stock.ttft_ms["long"]
    assert plain_ext.ttft_ms == stock.ttft_ms
