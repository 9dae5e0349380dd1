"""The command line of the scripts that record one server's answers to a file and compare the files
(bench.serving.greedy_check, bench.accuracy.passkey)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Command = Callable[[argparse.Namespace], int]


def run_and_compare(
    doc: str,
    cmd_run: Command,
    cmd_compare: Command,
    run_args: Callable[[Any], None],
    compare_args: Callable[[Any], None] | None = None,
) -> int:
    """The `run` (one server, one label, one output file) / `compare` (files, --json) command line;
    `run_args` (`compare_args`) adds a script's own `run` (`compare`) options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--url", required=True)
    run.add_argument("--model-dir", required=True)
    run.add_argument("--label", required=True)
    run.add_argument("--out", required=True)
    run_args(run)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("files", nargs="+")
    cmp_.add_argument("--json")
    if compare_args is not None:
        compare_args(cmp_)
    a = parser.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_compare(a)
