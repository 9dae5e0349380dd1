"""The schedule replay engine (bench/schedule_replay.py), imported once SGLang is patched."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sglang_prefill_ext import adapters
from sglang_prefill_ext.patching import PatchSet

REPLAY_PATH = Path(__file__).resolve().parents[2] / "bench" / "schedule_replay.py"


def ported(*options: str) -> pytest.MarkDecorator:
    """Skip where the installed SGLang's hooks refuse one of `options` (not in its `PORTED_OPTIONS`)."""
    served = adapters.current("hooks").PORTED_OPTIONS
    missing = [] if served is None else [name for name in options if name not in served]
    flags = ", ".join(f"--prefill-ext-{name.replace('_', '-')}" for name in missing)
    return pytest.mark.skipif(
        bool(missing), reason=f"{flags}: not ported to SGLang {adapters.installed_version()}"
    )


def load_replay() -> ModuleType:
    """Import bench/schedule_replay.py (SGLang must already be patched)."""
    spec = importlib.util.spec_from_file_location("schedule_replay", REPLAY_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def replay(patched_sglang: PatchSet) -> ModuleType:
    return load_replay()
