"""The schedule replay engine (bench.replay.schedule_replay) and its mixed-traffic clock
(bench.replay.mixed_replay), imported once SGLang is patched; a lone prompt with shorts behind it."""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterable
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


@pytest.fixture(scope="session")
def mixed(patched_sglang: PatchSet) -> ModuleType:
    return importlib.import_module("bench.replay.mixed_replay")


def lone_prompt(mixed: ModuleType, replay: ModuleType, tokens: int, shorts_at_ms: Iterable[float]) -> list:
    """A `tokens`-token prompt at 0 ms, 1K-token shorts generating 8 tokens at `shorts_at_ms`."""
    rng = random.Random(1)
    out = [mixed.Arrival(0.0, replay.TraceReq("long", tuple(replay._tokens(rng, tokens))), "long")]
    for i, at in enumerate(shorts_at_ms):
        req = replay.TraceReq(f"s{i}", tuple(replay._tokens(rng, 1024)), max_new_tokens=8)
        out.append(mixed.Arrival(at, req, "short"))
    return out
