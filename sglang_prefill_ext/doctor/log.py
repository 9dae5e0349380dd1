"""Reading `--prefill-ext-log` files for the doctor: one `Request` per finished request line, and the
times the server's cache was flushed (`runner.request_log.FlushRecord` lines). A line that is not a
record (cut off when the server was killed mid-write, or garbled) is skipped and counted; only a file
with no valid line is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


class LogError(ValueError):
    """A log the doctor cannot read: missing, or without one valid line."""


@dataclasses.dataclass(frozen=True)
class Fingerprinted:
    """A prompt's fingerprint as the log holds it (`fingerprint.Fingerprint`) and its timing."""

    block: int
    blocks: list[str]
    anchors: list[int]
    anchored: list[str]
    start_ms: float
    end_ms: float  # start_ms + prefill_ms: its prompt's KV is in the cache from then on


@dataclasses.dataclass(frozen=True)
class Blended:
    """A request's chunk tokens past the prefix cache's match under --prefill-ext-blend (the log line's
    `blend`): reused from the chunk store, recomputed in the chunks reused, the rest computed."""

    chunk_tokens: int
    hits: int
    reused_tokens: int
    recomputed_tokens: int


@dataclasses.dataclass(frozen=True)
class Request:
    rid: str
    input_len: int
    cached: int  # the prefix cache's hit (SGLang's cached_tokens, less what blending reused)
    fp: Fingerprinted | None
    output: int = 0  # tokens generated: in the cache after the prompt once the request finished
    blend: Blended | None = None


@dataclasses.dataclass(frozen=True)
class Log:
    path: Path
    requests: list[Request]  # in the order their prefill started
    aborted: int  # aborted requests, left out
    flushes: list[float]  # when the cache was emptied, on the clock of `Fingerprinted.start_ms`
    skipped: list[int]  # numbers of the lines that are not records, left out


def _request(record: dict) -> Request | None:
    """The request of one log line; None for an aborted request (no prompt reached the cache)."""
    if record.get("error") is not None:
        return None
    fp = None
    if "fp" in record:
        start = float(record["start_ms"])
        fp = Fingerprinted(
            int(record["fp_block"]),
            list(record["fp"]),
            [int(a) for a in record["fp_anchors"]],
            list(record["fp_anchored"]),
            start,
            start + max(float(record["prefill_ms"]), 0.0),
        )
    blend = record.get("blend")
    blended = (
        None
        if blend is None
        else Blended(**{f.name: int(blend[f.name]) for f in dataclasses.fields(Blended)})
    )
    # SGLang counts the chunks a blended request reused as cached too: each pass's prefix
    reused = 0 if blended is None else blended.reused_tokens
    return Request(
        str(record["rid"]),
        int(record["input_len"]),
        int(record["cached_tokens"]) - reused,
        fp,
        int(record.get("output_tokens", 0)),
        blended,
    )


def read_log(path: Path) -> Log:
    """One log: its finished requests in the order their prefill started (the file's order when a
    line has no start time), how many aborted ones were left out, its flushes, and the lines skipped
    as malformed. LogError when it cannot be read or holds no valid line."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        raise LogError(f"{path}: {error.strerror or error}") from None
    requests, aborted, flushes, skipped = [], 0, [], []
    first_error = ""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if "flush_ms" in record:
                flushes.append(float(record["flush_ms"]))
                continue
            request = _request(record)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            skipped.append(number)
            first_error = first_error or f"line {number}: {error}"
            continue
        if request is None:
            aborted += 1
        else:
            requests.append(request)
    if not requests and not aborted:
        reason = f"no valid line of {len(skipped)} ({first_error})" if skipped else "no request lines"
        raise LogError(f"{path}: not a --prefill-ext-log: {reason}")
    if all(r.fp is not None and r.fp.start_ms >= 0 for r in requests):
        requests.sort(key=lambda r: r.fp.start_ms)  # type: ignore[union-attr]
    return Log(path, requests, aborted, sorted(flushes), skipped)
