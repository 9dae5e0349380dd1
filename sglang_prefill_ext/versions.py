"""The SGLang versions this package supports: exactly those it ships patches for.

The patch folders (`patches/sglang-X/`, package data) are the one list; the adapters, the CLI,
make and CI all read it from here (CI and make list the folders).
"""

from __future__ import annotations

from pathlib import Path

PATCHES_ROOT = Path(__file__).resolve().parent / "patches"


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))


def supported_versions(root: Path = PATCHES_ROOT) -> list[str]:
    """Oldest first."""
    found = [p.name.removeprefix("sglang-") for p in root.glob("sglang-*") if p.is_dir()]
    return sorted(found, key=version_key)
