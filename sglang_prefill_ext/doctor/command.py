"""`sglang-prefill-ext doctor LOG.jsonl [LOG ...] [--png FILE] [--json]`: why prompts miss the
prefix cache and what a change to the prompt layout would save, from `--prefill-ext-log` files
written with `--prefill-ext-log-fingerprints` (each log one server's cache). Plain text by default;
errors (a bad flag or value, a log with no valid line) are one `error:` line on stderr, exit status
1; malformed lines (a last line cut off mid-write) are skipped with one `warning:` line counting them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from sglang_prefill_ext.doctor import plot, report
from sglang_prefill_ext.doctor.log import Log, read_log
from sglang_prefill_ext.runner.pass_cost import PassCost

PROG = "sglang-prefill-ext doctor"


class _Refused(Exception):
    """A bad command line: its one-line reason."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage and exits 2
        raise _Refused(message)


def _pass_cost(text: str) -> PassCost:
    try:
        return PassCost.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _skipped(logs: list[Log]) -> str | None:
    """The one warning for the malformed lines left out of every log, None when there are none."""
    skipped = [(log.path, log.skipped) for log in logs if log.skipped]
    if not skipped:
        return None
    count = sum(len(lines) for _, lines in skipped)
    where = "; ".join(
        f"{path} line{'s' * (len(lines) > 1)} {', '.join(map(str, lines))}" for path, lines in skipped
    )
    return f"{PROG}: warning: skipped {count} malformed line{'s' * (count > 1)} ({where})"


def main(argv: list[str]) -> int:
    parser = _Parser(prog=PROG, description=__doc__)
    parser.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="--prefill-ext-log files")
    parser.add_argument("--json", action="store_true", help="the report as JSON instead of text")
    parser.add_argument("--png", type=Path, help="also draw the report into this PNG (needs matplotlib)")
    parser.add_argument(
        "--pass-cost",
        type=_pass_cost,
        default=PassCost(),
        help=f"the server's --prefill-ext-pass-cost, for GPU seconds (default: {PassCost()})",
    )
    try:
        args = parser.parse_args(argv)
        logs = [read_log(path) for path in args.logs]
        result = report.build(logs, args.pass_cost)
    except (_Refused, ValueError) as error:  # a LogError, or logs of different fingerprint block sizes
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    warning = _skipped(logs)
    if warning is not None:
        print(warning, file=sys.stderr)
    if args.png is not None:
        try:
            plot.render(result, args.png)
        except ImportError:
            print(f"{PROG}: error: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 1
    print(json.dumps(result, indent=1) if args.json else report.text(result))
    return 0
