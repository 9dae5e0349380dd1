"""When a freshly prefilled request first decodes, on SGLang's real scheduler (CPU pools).

SGLang's `get_next_batch_to_run` merges the last batch into the running batch before it forms the
next one, in both event loops; the overlap loop only processes the last batch's result later (after
the next batch is launched). So a request whose prefill ran in pass k decodes in pass k + 1: as the
decode batch, or riding pass k + 1's mixed chunk.
"""

from __future__ import annotations

from types import ModuleType

import pytest

SHORT, LONG = 300, 3000


def token_passes(scheduler: object, rid: str) -> list[int]:
    """The passes that give `rid` a decode token: a decode step, or a decode riding a mixed chunk."""
    return [i for i, step in enumerate(scheduler.steps) if rid in step.decoded]  # type: ignore[attr-defined]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("mixed_chunk", [False, True], ids=["decode-pass", "mixed-chunk"])
def test_a_request_prefilled_in_pass_k_decodes_in_pass_k_plus_1(
    replay: ModuleType, overlap: bool, mixed_chunk: bool
) -> None:
    """`short` is prefilled in pass 0 and generates 4 tokens: its prefill's, then one in each of
    passes 1-3, alone (no other request) or riding the chunks of a long prompt arriving after pass 0."""
    config = replay.ReplayConfig(
        ext=False,
        chunked_prefill_size=1024,
        pool_tokens=1 << 14,
        overlap=overlap,
        extra_args=("--enable-mixed-chunk",) if mixed_chunk else (),
    )
    scheduler = replay.ReplayScheduler(config)
    scheduler.add(replay.TraceReq("short", tuple(range(1000, 1000 + SHORT)), max_new_tokens=4))
    scheduler.step()
    if mixed_chunk:
        scheduler.add(replay.TraceReq("long", tuple(range(5000, 5000 + LONG)), max_new_tokens=1))
    while scheduler.busy():
        scheduler.step()
        assert scheduler.kv_accounting_errors() == []
    assert scheduler.steps[0].admitted == [("short", 0, SHORT)]
    assert token_passes(scheduler, "short") == [1, 2, 3]
    if mixed_chunk:  # passes 1-3 are the long prompt's chunks
        assert [step.riding for step in scheduler.steps[1:4]] == [["short"]] * 3
    assert len(scheduler.finished["short"].output_ids) == 4
