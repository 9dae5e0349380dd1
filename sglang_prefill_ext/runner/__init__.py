"""The extension's prefill runner: version-free scheduling decisions (no SGLang imports).

`inflight` knows which uncached pages are being computed right now; `waiting` keeps what each
waiting request needs across passes (aging, its last match) and orders the queue; `runner`
combines them into the calls a per-version scheduler adapter makes once per pass.
"""

from __future__ import annotations

from sglang_prefill_ext.runner.inflight import Flight, InflightRegistry, Position
from sglang_prefill_ext.runner.runner import PrefillRunner, RunnerCounters
from sglang_prefill_ext.runner.waiting import WaitState, lpm_aging_key

__all__ = [
    "Flight",
    "InflightRegistry",
    "Position",
    "PrefillRunner",
    "RunnerCounters",
    "WaitState",
    "lpm_aging_key",
]
