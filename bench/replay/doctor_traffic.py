"""Synthesized traffic for checking the cache doctor (`tests/doctor`, `bench.replay.doctor_advice`),
and its exact re-run.

A prompt is a list of named segments (a system prompt, a document, a question). Requests run one
after another, each cached once it finished, against an exact page-1 prefix cache of unbounded size:
the log is written with the project's own fingerprint and request record, and the same traffic re-run
with a fix gives the saving the doctor must report."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np

from sglang_prefill_ext.doctor.fingerprint import fingerprint
from sglang_prefill_ext.runner.request_log import FingerprintedRecord

BLOCK = 256
Segment = tuple[str, list[int]]


@dataclasses.dataclass(frozen=True)
class Prompt:
    rid: str
    segments: list[Segment]

    @property
    def tokens(self) -> list[int]:
        return [t for _, part in self.segments for t in part]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 128000) for _ in range(n)]


def cached(prompts: list[Prompt]) -> list[int]:
    """Each request's page-1 prefix-cache hit: its longest common prefix with an earlier prompt."""
    parts = [[(name, np.asarray(part, dtype=np.int64)) for name, part in p.segments if part] for p in prompts]
    return [max((_common(a, b) for b in parts[:i]), default=0) for i, a in enumerate(parts)]


def _common(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]]) -> int:
    """The tokens two prompts share in front: their segments alike by name (a name stands for its
    tokens), then the first two that differ token by token, and on only where one is the other's
    prefix."""
    k = 0
    while k < min(len(a), len(b)) and a[k][0] == b[k][0]:
        k += 1
    shared = sum(len(part) for _, part in a[:k])
    if k == min(len(a), len(b)):
        return shared
    first = _prefix(a[k][1], b[k][1])
    if first < min(len(a[k][1]), len(b[k][1])):
        return shared + first
    return shared + _prefix(np.concatenate([p for _, p in a[k:]]), np.concatenate([p for _, p in b[k:]]))


def _prefix(x: np.ndarray, y: np.ndarray) -> int:
    n = min(len(x), len(y))
    differ = np.flatnonzero(x[:n] != y[:n])
    return int(differ[0]) if len(differ) else n


def prefill(prompts: list[Prompt]) -> int:
    """Prompt tokens computed (not cached) over the whole traffic."""
    return sum(len(p.tokens) - hit for p, hit in zip(prompts, cached(prompts), strict=True))


def seen_before(prompts: list[Prompt]) -> int:
    """Tokens computed that an earlier prompt holds at any position, in whole segments: what reusing
    chunks at any position would save beyond the prefix cache."""
    seen: set[str] = set()
    total = 0
    for p, hit in zip(prompts, cached(prompts), strict=True):
        start = 0
        for name, part in p.segments:
            if name in seen:
                total += max(0, start + len(part) - max(start, hit))
            start += len(part)
        seen |= {name for name, _ in p.segments}
    return total


def write_log(path: Path, prompts: list[Prompt]) -> Path:
    """The --prefill-ext-log of this traffic with fingerprints: request i starts at 10 i ms and its
    prefill ends 5 ms later."""
    lines = []
    for i, (p, hit) in enumerate(zip(prompts, cached(prompts), strict=True)):
        ids = p.tokens
        fp = fingerprint(ids, BLOCK, "")
        record = FingerprintedRecord(
            rid=p.rid,
            input_len=len(ids),
            cached_tokens=hit,
            deduped_tokens=0,
            chunks=1,
            queue_passes=0,
            budgeted_chunks=0,
            queue_ms=0.0,
            prefill_ms=5.0,
            ttft_ms=5.0,
            output_tokens=1,
            error=None,
            start_ms=10.0 * i,
            fp_block=BLOCK,
            fp=fp.blocks,
            fp_anchors=fp.anchors,
            fp_anchored=fp.anchored,
        )
        lines.append(json.dumps(dataclasses.asdict(record), separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n")
    return path
