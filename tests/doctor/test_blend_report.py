"""The doctor on a log of blended requests (--prefill-ext-blend): what blending recovered (chunk
tokens reused from the chunk store) beside what was still recomputed (in the chunks reused, and in
chunks computed whole), and the prefix cache's own hits apart from it. The same on a real engine's
log: tests/blend/test_blend_serving.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from sglang_prefill_ext.blend.plan import BlendCounts
from sglang_prefill_ext.doctor import report
from sglang_prefill_ext.doctor.log import read_log
from sglang_prefill_ext.runner.pass_cost import PassCost
from sglang_prefill_ext.runner.request_log import RequestRecord


def _line(rid: str, cached: int, blend: BlendCounts | None, error: str | None = None) -> str:
    record = RequestRecord(
        rid=rid,
        input_len=1000,
        cached_tokens=cached,
        deduped_tokens=0,
        chunks=1,
        queue_passes=0,
        budgeted_chunks=0,
        queue_ms=0.0,
        prefill_ms=5.0,
        ttft_ms=5.0,
        output_tokens=1,
        error=error,
        blend=None if blend is None else dataclasses.asdict(blend),
    )
    return json.dumps(dataclasses.asdict(record))


def test_the_report_says_what_blending_recovered_and_what_was_recomputed(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [
        _line("store", 100, BlendCounts(chunk_tokens=800, hits=0, reused_tokens=0, recomputed_tokens=0)),
        # SGLang's cached_tokens counts the reused chunks too: 100 matched in the tree, 600 reused
        _line("reuse", 700, BlendCounts(chunk_tokens=800, hits=4, reused_tokens=600, recomputed_tokens=120)),
        _line(
            "aborted",
            100,
            BlendCounts(chunk_tokens=800, hits=4, reused_tokens=600, recomputed_tokens=120),
            "Aborted",
        ),
        _line("plain", 300, None),
    ]
    log.write_text("\n".join(lines) + "\n")
    result = report.build([read_log(log)], PassCost())
    assert result["blend"] == {
        "requests": 2,
        "hits": 4,
        "chunk_tokens": 1600,
        "reused_tokens": 600,
        "recomputed_tokens": 120,
        "computed_tokens": 880,
    }
    assert result["cached_tokens"] == 100 + 100 + 300  # the prefix cache's hits, without the reused chunks
    assert (
        "chunk blending: 2 requests, 1,600 chunk tokens past the prefix cache's match: 600 reused from the "
        "chunk store (4 chunks), 120 recomputed in the chunks reused, 880 computed in chunks not reused (missed, "
        "or computed whole)"
    ) in report.text(result)


def test_a_log_without_blending_says_nothing_of_it(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text(_line("plain", 300, None) + "\n")
    result = report.build([read_log(log)], PassCost())
    assert result["blend"] is None
    assert "chunk blending" not in report.text(result)
