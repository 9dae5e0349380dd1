#!/usr/bin/env python3
"""The cache doctor's claimed savings against exact re-runs of synthesized traffic (issue 41): each
scenario of `doctor_scenarios`, over seeds, written as a `--prefill-ext-log` with fingerprints
(`doctor_traffic`), read by the doctor; the exact saving of a layout fix is the same traffic re-run
with the fix applied, the exact non-prefix reuse the whole segments an earlier prompt held that the
fixed layout leaves to compute. No SGLang needed (a few seconds on 2 cores).

    python -m bench.replay.doctor_advice                    # the table on stdout
    python -m bench.replay.doctor_advice --out bench/results/2026-12-04-doctor-advice.md
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import platform
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

from bench.replay.doctor_scenarios import agents, clean, profiles, rag_subsets, stanzas
from bench.replay.doctor_traffic import Prompt, prefill, seen_before, write_log
from sglang_prefill_ext.doctor import report
from sglang_prefill_ext.doctor.log import read_log
from sglang_prefill_ext.runner.pass_cost import PassCost

COMMAND = "python -m bench.replay.doctor_advice --out bench/results/2026-12-04-doctor-advice.md"


Traffic = tuple[list[Prompt], list[Prompt]] | list[Prompt]  # (planted, fixed), or prompts no fix applies to


@dataclasses.dataclass(frozen=True)
class Case:
    scenario: str
    seed: int
    traffic: Callable[[], Traffic]
    expected: tuple[str, ...]  # the findings the doctor must make, each checked against its exact count


@dataclasses.dataclass(frozen=True)
class Row:
    case: Case
    found: list[str]
    finding: str
    cost: str
    claimed: int
    exact: int

    @property
    def error(self) -> float | None:
        return 100 * (self.claimed - self.exact) / self.exact if self.exact else None


def cases() -> list[Case]:
    scenarios: list[tuple[str, Callable[..., Traffic], dict, range, tuple[str, ...]]] = [
        ("RAG, 6 of 20 chunks", rag_subsets, {"chunks": 20}, range(4), ("reordered", "non_prefix")),
        ("RAG, 6 of 50 chunks", rag_subsets, {"chunks": 50}, range(4), ("reordered", "non_prefix")),
        ("300-token stanzas, an edit from request 20", stanzas, {}, range(6), ("changed_prefix",)),
        ("profiles of 176-763 tokens before a 20K document", profiles, {}, range(4), ("dynamic",)),
        ("agents re-reading files from a shared pool", agents, {}, range(4), ("non_prefix",)),
        ("clean: shared docs, append-only chat, id at the end", clean, {}, range(4), ()),
    ]
    return [
        Case(name, seed, functools.partial(build, seed=seed, **options), expected)
        for name, build, options, seeds, expected in scenarios
        for seed in seeds
    ]


def _exact(finding: str, planted: list[Prompt], fixed: list[Prompt]) -> int:
    return seen_before(fixed) if finding == report.NON_PREFIX else prefill(planted) - prefill(fixed)


def measure(case: Case, out: Path) -> list[Row]:
    """The case's rows: one per expected finding (a row `none` when none is expected)."""
    traffic = case.traffic()
    planted, fixed = traffic if isinstance(traffic, tuple) else (traffic, traffic)
    log = write_log(out / "requests.jsonl", planted)
    findings = {f["pattern"]: f for f in report.build([read_log(log)], PassCost())["findings"]}
    found = sorted(findings)
    if not case.expected:
        return [Row(case, found, "none", "-", sum(f["tokens"] for f in findings.values()), 0)]
    return [
        Row(
            case,
            found,
            kind,
            findings.get(kind, {}).get("cost", "-"),
            findings.get(kind, {}).get("tokens", 0),
            _exact(kind, planted, fixed),
        )
        for kind in case.expected
    ]


def table(rows: list[Row]) -> str:
    lines = [
        "| scenario | seed | findings | finding checked | cost | doctor's claimed saving | exact re-run saving | error % |",
        "|---|---:|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        error = "-" if r.error is None else f"{r.error:+.1f}"
        lines.append(
            f"| {r.case.scenario} | {r.case.seed} | {', '.join(r.found) or 'none'} | {r.finding} | {r.cost} "
            f"| {r.claimed:,} | {r.exact:,} | {error} |"
        )
    return "\n".join(lines)


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def spread(rows: list[Row]) -> str:
    """Per scenario and finding checked, the error's range over the seeds."""
    errors: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.error is not None:
            errors.setdefault((r.case.scenario, r.finding), []).append(r.error)
    return "\n".join(
        f"- {scenario}, {finding}: {min(e):+.1f} % to {max(e):+.1f} % over {len(e)} seeds"
        for (scenario, finding), e in errors.items()
    )


def page(rows: list[Row]) -> str:
    about = (
        f"Commit {_commit()} (branch `issue-41-s45`), Python {platform.python_version()} on the CPU box; the "
        "doctor imports no SGLang. Each log is written by `bench/replay/doctor_traffic.py` with the project's "
        "own fingerprint and request record, its `cached_tokens` from an exact page-1 prefix cache of unbounded "
        "size. The exact saving of a layout fix is the same traffic re-run with the fix applied "
        "(`prefill(planted) - prefill(fixed)`: RAG chunks in the order first seen, the edited stanza after the "
        "document, the profile after the document); exact non-prefix reuse is the tokens of whole segments an "
        "earlier prompt held that the fixed layout leaves to compute (`seen_before(fixed)`). Error % is "
        "(claimed - exact) / exact. `tests/doctor/test_advice.py` holds the same cases to the bounds its "
        "comments give. The table and the spread are regenerated by:"
    )
    return "\n".join(
        [
            "# The cache doctor's advice against exact re-runs (issue 41), 2026-12-04",
            "",
            textwrap.fill(about, width=110),
            "",
            "```",
            COMMAND,
            "```",
            "",
            table(rows),
            "",
            "The error's spread:",
            "",
            spread(rows),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="write the results page here (default: the table on stdout)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for case in cases() for row in measure(case, Path(tmp))]
    if args.out is None:
        print(table(rows))
    else:
        args.out.write_text(page(rows), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
