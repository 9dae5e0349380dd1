"""`--prefill-ext-log PATH`: one JSON line per finished request, written as it finishes."""

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
    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    output_tokens: int
    error: str | None


class JsonlLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        line = json.dumps(dataclasses.asdict(record), separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        self._file.close()
