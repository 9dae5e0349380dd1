"""Hypothesis settings for the radix machines: 'ci' (fixed seed, >= 1e5 steps in all) or 'soak'.

Choose with HYPOTHESIS_PROFILE=soak; applied to these machines only, not to the whole session.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}

settings.register_profile("radix-ci", derandomize=True, stateful_step_count=60, **_COMMON)
settings.register_profile("radix-soak", max_examples=20_000, stateful_step_count=200, **_COMMON)


def machine_settings(ci_examples: int) -> settings:
    """The profile named by HYPOTHESIS_PROFILE; in CI, `ci_examples` runs of up to 60 steps."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "soak":
        return settings.get_profile("radix-soak")
    return settings(settings.get_profile("radix-ci"), max_examples=ci_examples)


class StepCounter:
    """Counts executed machine steps, reported at the end of the run (the CI budget is >= 1e5)."""

    steps: dict[str, int] = {}

    @classmethod
    def count(cls, machine: str) -> None:
        cls.steps[machine] = cls.steps.get(machine, 0) + 1
