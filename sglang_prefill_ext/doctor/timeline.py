"""The order a log's cache saw its prompts: requests served in the order their prefill started, a
prompt cached for the requests that start after its prefill ended, the cache emptied at each flush.
One source of that order for the diagnosis (`analysis`) and the layout re-runs (`layout`)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from sglang_prefill_ext.doctor.log import Request

FLUSH = -1  # the event `events` yields when the cache is emptied


def events(requests: Sequence[Request], flushes: Sequence[float] = ()) -> Iterator[tuple[str, int]]:
    """("flush", FLUSH), ("cache", i): requests[i]'s prompt enters the cache, ("serve", i): requests[i]
    starts, in that order of time. Every request is fingerprinted, in start order; `flushes` sorted."""
    pending: list[tuple[float, int]] = []  # (prefill end, index): prompts not in the cache yet
    flushes = list(flushes)
    for now, request in enumerate(requests):
        start = request.fp.start_ms  # type: ignore[union-attr]
        while flushes and flushes[0] <= start:
            flush = flushes.pop(0)
            pending = [(end, index) for end, index in pending if end > flush]  # SGLang flushes when idle
            heapq.heapify(pending)
            yield "flush", FLUSH
        while pending and pending[0][0] <= start:
            yield "cache", heapq.heappop(pending)[1]
        yield "serve", now
        heapq.heappush(pending, (request.fp.end_ms, now))  # type: ignore[union-attr]
