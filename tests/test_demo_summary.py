"""The demo's closing summary, read from the two CPU benchmarks' tables."""

from __future__ import annotations

from bench.replay import demo_summary

REPLAY = """command: python bench/schedule_replay.py --lpm-waiting 128

| trace | mode | prefill tokens | ideal | tokens / ideal | passes | decisions/s | CPU ms / step |
|---|---|---:|---:|---:|---:|---:|---:|
| burst-4k | stock-fcfs | 12,288 | 8,192 | 1.50 | 2 | 2,094 | 4.06 |
| burst-4k | ext-fcfs | 8,192 | 8,192 | 1.00 | 2 | 5,185 | 1.54 |
| unique | stock-fcfs | 48,000 | 48,000 | 1.00 | 6 | 8,652 | 0.40 |
| unique | ext-fcfs | 48,000 | 48,000 | 1.00 | 6 | 2,233 | 1.57 |

| mode | N waiting | first pass ms | next pass ms |
|---|---:|---:|---:|
| stock-lpm | 128 | 9.3 | 8.4 |
| ext-lpm | 128 | 6.4 | 0.7 |
"""

RADIX = """| page | prompt tokens | operation | stock p50 (µs) | prefill-ext p50 (µs) | speed-up |
|---:|---:|---|---:|---:|---:|
| 1 | 32768 | insert | 35.3 | 16.1 | 2.2x |
| 1 | 32768 | evict | 114.2 | 135.9 | 0.8x |
| 16 | 32768 | insert | 38.2 | 15.5 | 2.5x |
| 16 | 32768 | evict | 40.1 | 32.4 | 1.2x |
"""


def test_summary_names_savings_costs_and_the_tree_ratios() -> None:
    replay = demo_summary.replay_lines(REPLAY)
    assert "ext saved on burst-4k (fcfs) 8,192 vs 12,288 (-33%)" in replay[0]
    assert "never more than stock; stock already computes the ideal on unique" in replay[0]
    assert replay[1].startswith(
        "Scheduling CPU per pass: ext slower on 1 of 2 runs (unique (fcfs) 1.57 vs 0.40 ms)"
    )
    assert "ext 0.7 ms vs stock 8.4 ms" in replay[2]
    radix = demo_summary.radix_lines(RADIX)
    assert radix[0].startswith("Prefix tree vs stock RadixCache: insert 2.2-2.5x; evict 0.8-1.2x")
    assert radix[1].startswith("evict below 1x")
