"""The schedule replay engine (bench.replay.schedule_replay), imported once SGLang is patched."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from sglang_prefill_ext import adapters
from sglang_prefill_ext.patching import PatchSet


def ported(*options: str) -> pytest.MarkDecorator:
    """Skip where the installed SGLang's hooks refuse one of `options` (not in its `PORTED_OPTIONS`)."""
    served = adapters.current("hooks").PORTED_OPTIONS
    missing = [] if served is None else [name for name in options if name not in served]
    flags = ", ".join(f"--prefill-ext-{name.replace('_', '-')}" for name in missing)
    return pytest.mark.skipif(
        bool(missing), reason=f"{flags}: not ported to SGLang {adapters.installed_version()}"
    )


def load_replay() -> ModuleType:
    """Import bench.replay.schedule_replay (SGLang must already be patched)."""
    return importlib.import_module("bench.replay.schedule_replay")


@pytest.fixture(scope="session")
def replay(patched_sglang: PatchSet) -> ModuleType:
    return load_replay()
