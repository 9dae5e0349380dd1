"""`revert --force-stock`: SGLang's own files back from its wheel, found without the network.

Every file that SGLang's installed RECORD hashes and that no longer has that hash (patched, changed
by hand, missing) is rewritten from a wheel of the same version, whose copy of each such file must
hash to the RECORD's value; a wheel that lacks one or holds another is not used. Nothing is written
unless every such file can be restored.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from sglang_prefill_ext.patching.tree import (
    PatchError,
    record_digest,
    reinstall_command,
    stock_digests,
    write_files,
)


def changed_files(sglang_dir: Path, digests: dict[str, str]) -> list[str]:
    """The RECORD's paths inside `sglang_dir` whose file is missing or hashes otherwise."""
    root = sglang_dir.resolve()
    changed = []
    for name, digest in sorted(digests.items()):
        path = (sglang_dir / name).resolve()
        if not path.is_relative_to(root):
            continue  # a script pip put in bin/: not SGLang's package
        if not path.is_file() or record_digest(path.read_bytes()) != digest:
            changed.append(name)
    return changed


def pip_cache_dir() -> Path | None:
    """Where this interpreter's pip keeps its cache (None: no pip, or its cache is off)."""
    found = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=False
    )
    path = Path(found.stdout.strip())
    return path if found.returncode == 0 and path.is_dir() else None


def candidate_wheels(version: str, given: Path | None) -> list[Path]:
    """`given` (a wheel, or a folder of them), else every file in pip's cache that is a zip holding
    `sglang-<version>.dist-info/RECORD`: pip keeps downloaded wheels under hashed names."""
    if given is not None:
        return sorted(given.glob(f"sglang-{version}-*.whl")) if given.is_dir() else [given]
    cache = pip_cache_dir()
    if cache is None:
        return []
    return [p for p in sorted(cache.rglob("*")) if p.is_file() and _holds_sglang(p, version)]


def _holds_sglang(path: Path, version: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as wheel:
        return f"sglang-{version}.dist-info/RECORD" in wheel.namelist()


def _stock_contents(wheel_path: Path, names: list[str], digests: dict[str, str]) -> dict[str, bytes]:
    """Each name's bytes from the wheel, checked against the installed RECORD; raises naming the
    first file the wheel lacks or holds otherwise."""
    found = {}
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            members = set(wheel.namelist())
            for name in names:
                if name not in members:
                    raise PatchError(f"{wheel_path} has no {name}")
                data = wheel.read(name)
                if record_digest(data) != digests[name]:
                    raise PatchError(f"{wheel_path}: {name} does not hash as SGLang's RECORD says")
                found[name] = data
    except (OSError, zipfile.BadZipFile) as e:
        raise PatchError(f"{wheel_path}: not a readable wheel ({e})") from e
    return found


def restore_stock(sglang_dir: Path, version: str, wheel: Path | None = None) -> tuple[Path | None, list[str]]:
    """Rewrite every changed file from the first wheel that holds all of them as the RECORD says.
    Returns the wheel used (None when nothing had changed) and the files written."""
    digests = stock_digests(sglang_dir, version)
    names = changed_files(sglang_dir, digests)
    if not names:
        return None, []
    candidates = candidate_wheels(version, wheel)
    rejected = []
    for candidate in candidates:
        try:
            contents = _stock_contents(candidate, names, digests)
        except PatchError as e:
            rejected.append(str(e))
            continue
        return candidate, write_files({sglang_dir / name: data for name, data in contents.items()})
    where = f"in {wheel}" if wheel is not None else "in pip's cache (or pass --wheel PATH)"
    why = f" ({'; '.join(rejected)})" if rejected else ""
    raise PatchError(
        f"no usable sglang-{version} wheel {where}{why}, nothing changed; back to stock: "
        f"{reinstall_command(sglang_dir, version)}"
    )
