"""Test-only timing in the engine's processes (tests/runner/engine_driver.py puts this folder first on
their path, so Python imports this at start-up).

With PREFILL_EXT_TEST_HOLD_SLICE=RID, the first slice of request RID's second or later chunk
(`--prefill-ext-yield-layers`) waits, once, until a request is waiting on the scheduler's socket from
the tokenizer: a request sent after RID's first chunk then arrives while one of RID's slices runs,
whatever the CPU's load, instead of at a random point that may fall between two passes.
"""

from __future__ import annotations

import os

_RID = os.environ.get("PREFILL_EXT_TEST_HOLD_SLICE")
_WAIT_MS = 120_000

if _RID:
    from typing import Any

    from sglang_prefill_ext.adapters.v0_5_17 import layer_yield

    _forward_slice = layer_yield.ServerEngine.forward_slice
    _held: list[bool] = []

    def _holding_forward_slice(self: Any, batch: Any, reinit: bool) -> Any:
        (req,) = batch.reqs
        if not _held and req.rid == _RID and batch.split_index == 0 and len(req.prefix_indices) > 0:
            _held.append(True)
            if not self.scheduler.recv_from_tokenizer.poll(_WAIT_MS):
                raise TimeoutError(f"no request arrived while {_RID}'s slice was held")
        return _forward_slice(self, batch, reinit)

    layer_yield.ServerEngine.forward_slice = _holding_forward_slice
