from __future__ import annotations

import pytest

from tests.radix.profiles import StepCounter


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if StepCounter.steps:
        total = sum(StepCounter.steps.values())
        detail = ", ".join(f"{name}={count}" for name, count in sorted(StepCounter.steps.items()))
        terminalreporter.write_line(f"radix state-machine steps: {total} ({detail})")
