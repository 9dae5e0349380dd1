"""`sglang-prefill-ext doctor LOG.jsonl [LOG ...] [--png FILE] [--json]`: why prompts miss the
prefix cache and what a change to the prompt layout would save, from `--prefill-ext-log` files
written with `--prefill-ext-log-fingerprints` (each log one server's cache). Plain text by default;
errors are one line on stderr, exit status 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_prefill_ext.doctor import plot, report
from sglang_prefill_ext.doctor.log import LogError, read_log
from sglang_prefill_ext.runner.pass_cost import PassCost


def _pass_cost(text: str) -> PassCost:
    try:
        return PassCost.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sglang-prefill-ext doctor", description=__doc__)
    parser.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="--prefill-ext-log files")
    parser.add_argument("--json", action="store_true", help="the report as JSON instead of text")
    parser.add_argument("--png", type=Path, help="also draw the report into this PNG (needs matplotlib)")
    parser.add_argument(
        "--pass-cost",
        type=_pass_cost,
        default=PassCost(),
        help=f"the server's --prefill-ext-pass-cost, for GPU seconds (default: {PassCost()})",
    )
    args = parser.parse_args(argv)
    try:
        logs = [read_log(path) for path in args.logs]
        for log in logs:
            if not log.requests and not log.aborted:
                raise LogError(f"{log.path}: no request lines")
        result = report.build(logs, args.pass_cost)
    except ValueError as error:  # a LogError, or logs of different fingerprint block sizes
        print(f"sglang-prefill-ext doctor: {error}", file=sys.stderr)
        return 1
    if args.png is not None:
        try:
            plot.render(result, args.png)
        except ImportError:
            print(
                "sglang-prefill-ext doctor: --png needs matplotlib (pip install matplotlib)", file=sys.stderr
            )
            return 1
    print(json.dumps(result, indent=1) if args.json else report.text(result))
    return 0
