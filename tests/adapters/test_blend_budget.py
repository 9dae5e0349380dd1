"""A blended request's chunk budget (0.5.17 `PrefillExtScheduler`): before `PrefillAdder` takes it,
`defer` adds the tokens it would reuse to the budget when only its computed tokens fit; admitted whole,
it keeps them (the pass is charged its computed tokens), else the budget is what it was. Through real
admissions: tests/blend/test_blend_serving.py (a 344-token extend in one pass at a budget of 256)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("sglang.srt.managers.schedule_policy")

from sglang_prefill_ext.adapters.v0_5_17.scheduler import PrefillExtScheduler  # noqa: E402

PROMPT, MATCHED = 50, 10  # an extend of 40 tokens


class Blending:
    one_pass = True

    def __init__(self, reused: int) -> None:
        self.reused = reused

    @staticmethod
    def spans(req: Any) -> tuple[tuple[int, int], ...]:
        return ((MATCHED, PROMPT - 5),)

    def reusable(self, req: Any, spans: Any) -> int:
        return self.reused


def glue(reused: int) -> PrefillExtScheduler:
    scheduler = object.__new__(PrefillExtScheduler)  # only the budget's steps: no policy, no tree
    scheduler.blending = Blending(reused)
    return scheduler


def request(**fields: Any) -> SimpleNamespace:
    ids = list(range(PROMPT))
    return SimpleNamespace(
        origin_input_ids=ids,
        full_untruncated_fill_ids=ids,
        prefix_indices=[0] * MATCHED,
        return_logprob=False,
        logprob_start_len=-1,
        extend_range=SimpleNamespace(end=MATCHED),
        **fields,
    )


def admit(adder: SimpleNamespace, req: SimpleNamespace, end: int) -> None:
    """What `PrefillAdder.add_one_req` does: the extend [matched, end) taken, charged to the budget."""
    adder.can_run_list.append(req)
    req.extend_range.end = end
    adder.rem_chunk_tokens -= end - MATCHED


def test_admitted_whole_the_pass_is_charged_its_computed_tokens() -> None:
    scheduler, req, adder = glue(reused=30), request(), SimpleNamespace(rem_chunk_tokens=20, can_run_list=[])
    scheduler._credit_reused(req, adder)
    assert adder.rem_chunk_tokens == 20 + 30
    admit(adder, req, PROMPT)
    scheduler._settle_credit(adder)
    assert adder.rem_chunk_tokens == 20 - (40 - 30)


@pytest.mark.parametrize("end", [None, MATCHED + 20], ids=["refused", "chunked"])
def test_otherwise_the_budget_is_what_it_was(end: int | None) -> None:
    scheduler, req, adder = glue(reused=30), request(), SimpleNamespace(rem_chunk_tokens=20, can_run_list=[])
    scheduler._credit_reused(req, adder)
    if end is not None:
        admit(adder, req, end)
    scheduler._settle_credit(adder)
    assert adder.rem_chunk_tokens == (20 if end is None else 20 - (end - MATCHED))


@pytest.mark.parametrize(
    ("reused", "rem", "fields"),
    [
        (15, 20, {}),  # its 25 computed tokens do not fit either
        (30, 40, {}),  # its whole extend fits already
        (0, 20, {}),  # nothing to reuse
        (30, 20, {"return_logprob": True, "logprob_start_len": 0}),  # its prompt's logprobs: not blended
    ],
)
def test_no_credit(reused: int, rem: int, fields: dict[str, Any]) -> None:
    scheduler, req, adder = glue(reused), request(), SimpleNamespace(rem_chunk_tokens=rem, can_run_list=[])
    req.__dict__.update(fields)
    scheduler._credit_reused(req, adder)
    scheduler._settle_credit(adder)
    assert adder.rem_chunk_tokens == rem and scheduler._credit is None
