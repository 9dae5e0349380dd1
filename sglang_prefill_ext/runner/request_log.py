"""`--prefill-ext-log PATH`: one JSON line per finished request, written as it finishes;
`--prefill-ext-pass-log PATH`: one JSON line per prefill pass, written as it is scheduled."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """Times are scheduler-side: from entering the waiting queue (queue_ms ends at the first forward)."""

    rid: str
    input_len: int
    cached_tokens: int
    deduped_tokens: int
    chunks: int
    queue_passes: int  # scheduling passes it waited before its first forward
    budgeted_chunks: int  # of its chunks, those a short-first pass budget shortened
    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    output_tokens: int
    error: str | None
    # under --prefill-ext-blend, a request with chunk_spans: `blend.plan.BlendCounts` as a dict
    blend: dict[str, int] | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class FingerprintedRecord(RequestRecord):
    """A request's line under `--prefill-ext-log-fingerprints`: its first forward's time on the
    scheduler's clock and its prompt's fingerprint (`doctor.fingerprint`: hashes, no token ids)."""

    start_ms: float
    fp_block: int
    fp: list[str]
    fp_anchors: list[int]
    fp_anchored: list[str]


@dataclasses.dataclass(frozen=True)
class FlushRecord:
    """Under `--prefill-ext-log-fingerprints`: the prefix cache was emptied (SGLang's /flush_cache) at
    `flush_ms`, the clock of `FingerprintedRecord.start_ms`; nothing cached before it hits after."""

    flush_ms: float


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """One prefill pass as scheduled: `t_ms` on the scheduler's monotonic clock; `reqs` lists, per
    admitted request, [new tokens, cached tokens, 1 if its prompt continues in a later chunk]; `riding`:
    running requests' decode tokens in the pass (mixed chunk); `synced`: formed after the last pass's
    result (--prefill-ext-lone-chunk-sync), not while it ran; `between_slices`: formed between two layer
    slices of a lone prompt's pass (--prefill-ext-yield-layers; such a pass and the slices around it do
    not follow the gap rule below). While the overlap loop is busy the
    next pass is formed as this one is launched, and the one after once the last one finished: the gap
    from the next pass's `t_ms` to the one after it is this pass's forward time
    (bench/serving/fit_pass_cost.py fits the cost model to it)."""

    t_ms: float
    index: int
    waiting: int
    shorts: int
    budgeted: bool
    chunk: int
    predicted_ms: float
    reqs: list[list[int]]
    riding: int = 0
    synced: bool = False
    between_slices: bool = False


class JsonlLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: RequestRecord | FlushRecord | PassRecord) -> None:
        line = json.dumps(dataclasses.asdict(record), separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        self._file.close()
