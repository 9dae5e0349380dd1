"""The SGLang versions this package supports: exactly those it ships patches for.

The patch folders (`patches/sglang-X/` at the repository root) are the one list; the adapters, the
CLI, make and CI all read it (CI and make list the folders).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _patches_root() -> Path:
    """A wheel carries the patches inside the package (setup.py maps the repository's `patches/`
    there); a checkout, installed editable or on PYTHONPATH, keeps them at the repository root."""
    shipped = _PACKAGE / "patches"
    return shipped if shipped.is_dir() else _PACKAGE.parent / "patches"


PATCHES_ROOT = _patches_root()


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))


def supported_versions(root: Path = PATCHES_ROOT) -> list[str]:
    """Oldest first."""
    found = [p.name.removeprefix("sglang-") for p in root.glob("sglang-*") if p.is_dir()]
    return sorted(found, key=version_key)
