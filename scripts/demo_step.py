"""Run one of the demo's Python steps with third-party noise held back.

    DEMO_HELD=FILE python scripts/demo_step.py SCRIPT [ARGS ...]
    DEMO_HELD=FILE python scripts/demo_step.py -m MODULE [ARGS ...]

Runs SCRIPT (or MODULE) as `python SCRIPT ARGS` (`python -m MODULE ARGS`) would. Warnings raised outside this project's code and log records
below ERROR from loggers outside this project (SGLang and torch warn about the missing GPU at every
import and every ServerArgs) are not printed; each is appended to FILE as one line, for
`python -m bench.replay.demo_summary --held FILE` to count. Errors, tracebacks, the exit status and everything the
step prints itself pass through unchanged.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import warnings
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[1]
OWN_CODE = tuple(REPO / folder for folder in ("sglang_prefill_ext", "bench", "scripts"))  # not .venv*/
OWN_LOGGERS = ("sglang_prefill_ext", "__main__")


def main() -> None:
    held = Path(os.environ["DEMO_HELD"])

    def hold(line: str) -> None:
        with held.open("a", encoding="utf-8") as f:
            f.write(" ".join(line.split()) + "\n")

    show_warning = warnings.showwarning

    def show_or_hold(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if any(Path(filename).resolve().is_relative_to(folder) for folder in OWN_CODE):
            show_warning(message, category, filename, lineno, file, line)
        else:
            hold(f"{category.__name__}: {message}")

    warnings.showwarning = show_or_hold
    # Every logger, torch's own handler (which does not propagate to the root) included, hands its
    # records to Logger.callHandlers once: the one place to hold them.
    call_handlers = logging.Logger.callHandlers

    def call_or_hold(self: logging.Logger, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.name.split(".")[0] in OWN_LOGGERS:
            call_handlers(self, record)
        else:
            hold(f"{record.name}: {record.getMessage()}")

    logging.Logger.callHandlers = call_or_hold  # type: ignore[method-assign]
    if sys.argv[1] == "-m":
        module, *args = sys.argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
