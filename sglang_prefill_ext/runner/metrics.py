"""Prometheus counters beside SGLang's own (`sglang:prefill_ext_*_total`), one set per process.

prometheus_client refuses a second metric of the same name, so `counters()` builds them once;
SGLang's multiprocess collection (PROMETHEUS_MULTIPROC_DIR, set by SGLang under --enable-metrics)
picks them up from the scheduler process like its own.
"""

from __future__ import annotations

import functools
from typing import Any

NAMES = {
    "hit_tokens": "Prompt tokens admitted with their KV already cached (SGLang's own hit count, per pass).",
    "evicted_tokens": "Tokens evicted from the extension's prefix tree.",
    "dedup_tokens": "In-flight tokens requests waited for instead of computing them again.",
    "deferrals": "Scheduling passes a request waited for in-flight pages.",
    "dedup_timeouts": "Requests that stopped waiting for in-flight pages at --prefill-ext-dedup-max-wait-passes.",
    "budgeted_passes": "Prefill passes sized to --prefill-ext-pass-budget-ms while short requests arrived.",
    "shortened_chunks": "Long prompts' chunks a pass budget made shorter than --chunked-prefill-size.",
    "yielded_tokens": "Tokens long prompts' chunks gave up to pass budgets (computed in later passes).",
}


@functools.cache
def counters() -> dict[str, Any]:
    from prometheus_client import Counter

    return {name: Counter(f"sglang:prefill_ext_{name}_total", text) for name, text in NAMES.items()}


class CounterDeltas:
    """Feeds cumulative counts (the tree's, the runner's) into the counters as increments."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def publish(self, totals: dict[str, int]) -> None:
        metrics = counters()
        for name, total in totals.items():
            delta = total - self._last.get(name, 0)
            if delta > 0:
                metrics[name].inc(delta)
            self._last[name] = total
