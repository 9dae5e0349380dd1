"""The CPU harness: SGLang's own objects built on the CPU, for the tests and the CPU replays.

Not part of serving: no patch and no adapter imports it. Like `adapters`, it imports SGLang, one
package per supported version (named as the adapter's, `v0_5_17` for 0.5.17) with the same modules:
`testing` (server args, tree-cache construction, stock's radix cache and keys, for the tests) and
`replay` (the scheduler's prefill path on CPU pools with no model, for `bench/replay/schedule_replay.py`
and the scheduler tests); `common` holds what the versions share.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from sglang_prefill_ext import adapters


def for_version(version: str, module: str) -> ModuleType:
    """The harness module `module` ("testing" or "replay") for SGLang `version`.

    Raises LookupError, naming the supported versions, for a version without an adapter."""
    adapters.for_version(version)  # refuses an unsupported version
    return importlib.import_module(f"{__name__}.{adapters.package_name(version)}.{module}")


def current(module: str) -> ModuleType:
    """`for_version` for the installed SGLang."""
    return for_version(adapters.installed_version(), module)


def require_patched() -> None:
    """Exit with one line unless the installed SGLang is patched: the replays drive its patched
    scheduler (stock's parser would refuse `--enable-prefill-ext` with its whole usage)."""
    from sglang_prefill_ext.patching import PatchSet, installed_sglang_dir, installed_version

    sglang_dir = installed_sglang_dir()
    version = installed_version(sglang_dir)
    status = PatchSet(version, sglang_dir).status()
    if status != "applied":
        raise SystemExit(
            f"error: SGLang {version} in {sglang_dir}: {status.split(':')[0]}; the replay needs it patched: "
            f"make apply SGLANG_VERSION={version} (or scripts/apply_patch.sh apply)"
        )
