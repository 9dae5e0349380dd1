"""Per-version adapters: the only code (with patches/) that touches SGLang's internals.

One package per supported SGLang version, named `v` + the version with dots as underscores
(`v0_5_17` for 0.5.17). `for_version` and `current` pick one without importing SGLang.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from sglang_prefill_ext.versions import supported_versions


def package_name(version: str) -> str:
    """The adapter package's module name for an SGLang version: 0.5.23 -> `v0_5_23`."""
    return "v" + version.replace(".", "_")


def for_version(version: str, module: str | None = None) -> ModuleType:
    """The adapter package for `version`, or its submodule `module` (e.g. "radix_cache")."""
    if version not in supported_versions():
        raise LookupError(
            f"no adapter for SGLang {version}; supported versions: {', '.join(supported_versions())}"
        )
    name = f"{__name__}.{package_name(version)}"
    return importlib.import_module(f"{name}.{module}" if module else name)


def installed_version() -> str:
    """The version of the sglang package the active Python imports (read without importing it)."""
    from sglang_prefill_ext.patching.tree import installed_sglang_dir, installed_version

    return installed_version(installed_sglang_dir())


def current(module: str | None = None) -> ModuleType:
    """`for_version` for the installed SGLang."""
    return for_version(installed_version(), module)


def make_sglang_cache(page_size: int = 1, **kw: Any) -> Any:
    """A simulated `PrefillExtRadixCache` for the installed SGLang; keywords as `RadixCache.create_simulated`
    (`mock_allocator`, ...).

    Raises LookupError, naming the supported versions, when the installed SGLang has no adapter.
    """
    return current("radix_cache").PrefillExtRadixCache.create_simulated(page_size=page_size, **kw)
