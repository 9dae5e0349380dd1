"""Apply, revert and inspect one SGLang version's patch set on an installed `sglang/` tree.

A file to patch is judged whole: it must hash to the sha256 that SGLang's installed RECORD holds
for it (stock) or be exactly that stock content with every hunk applied (patched); anything else
is a foreign change. Every verb first computes the outcome for every target file in memory; files
are written only when all of them can change, so a refused call leaves the tree untouched.
"""

from __future__ import annotations

import base64
import csv
import enum
import hashlib
import importlib.util
import os
import re
import shlex
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_prefill_ext.patching import unidiff
from sglang_prefill_ext.versions import PATCHES_ROOT, supported_versions


class PatchError(RuntimeError):
    """A verb was refused; nothing was written."""


class FileState(enum.Enum):
    PRISTINE = "not applied"
    PATCHED = "applied"
    FOREIGN = "changed by hand"
    MISSING = "missing"


@dataclass(frozen=True)
class Inspection:
    state: FileState
    content: str | None  # as read
    other: str | None  # PRISTINE: the patched content; PATCHED: the stock content


def record_digest(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass(frozen=True, eq=False)
class TargetFile:
    patch: Path
    diff: unidiff.FileDiff
    path: Path
    stock_digest: str

    def read(self) -> str | None:
        if not self.path.is_file():
            return None
        with open(self.path, encoding="utf-8", newline="") as f:
            return f.read()

    def _is_stock(self, content: str) -> bool:
        return record_digest(content.encode("utf-8")) == self.stock_digest

    def inspect(self) -> Inspection:
        content = self.read()
        if content is None:
            return Inspection(FileState.MISSING, None, None)
        if self._is_stock(content):
            patched = unidiff.apply(self.diff, content)
            if patched is None:
                raise PatchError(f"{self.patch.name} does not apply to stock {self.path}: a broken patch set")
            return Inspection(FileState.PRISTINE, content, patched)
        stock = unidiff.apply(self.diff.reversed(), content)
        if stock is not None and self._is_stock(stock) and unidiff.apply(self.diff, stock) == content:
            return Inspection(FileState.PATCHED, content, stock)
        return Inspection(FileState.FOREIGN, content, None)


def installed_sglang_dir() -> Path:
    """The folder holding the `sglang/` package that the active Python imports."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("no sglang package is importable by this Python; pass --sglang-dir")
    return Path(next(iter(spec.submodule_search_locations))).parent


_VERSION_ASSIGNMENT = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)


def installed_version(sglang_dir: Path) -> str:
    """Read the version without importing sglang (which would pull in torch and take seconds)."""
    for candidate in (sglang_dir / "sglang" / "_version.py", sglang_dir / "sglang" / "version.py"):
        if candidate.is_file():
            found = _VERSION_ASSIGNMENT.search(candidate.read_text(encoding="utf-8"))
            if found:
                return found.group(1)
    for metadata in sglang_dir.glob("sglang-*.dist-info/METADATA"):
        found = re.search(r"^Version: (\S+)$", metadata.read_text(encoding="utf-8"), re.M)
        if found:
            return found.group(1)
    raise PatchError(f"{sglang_dir} holds no sglang/_version.py or sglang dist-info: not an SGLang install")


def reinstall_command(sglang_dir: Path, version: str) -> str:
    """The pip line, for this interpreter, that puts stock SGLang `version` back into `sglang_dir`."""
    line = [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps"]
    purelib, platlib = (Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib"))
    if sglang_dir.resolve() not in (purelib, platlib):
        line += ["--upgrade", "--target", str(sglang_dir)]  # --upgrade: replace what is there
    return shlex.join([*line, f"sglang=={version}"])


def stock_digests(sglang_dir: Path, version: str) -> dict[str, str]:
    """Path (relative to `sglang_dir`) -> sha256 of the file as SGLang's wheel installed it."""
    record = sglang_dir / f"sglang-{version}.dist-info" / "RECORD"
    if not record.is_file():
        raise PatchError(
            f"{record} is missing: the stock content of SGLang's files cannot be checked; "
            f"reinstall SGLang: {reinstall_command(sglang_dir, version)}"
        )
    with open(record, encoding="utf-8", newline="") as f:
        return {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2 and row[1]}


class PatchSet:
    """The patches of one SGLang version, bound to one installed tree."""

    def __init__(self, version: str, sglang_dir: Path, root: Path = PATCHES_ROOT):
        versions = supported_versions(root)
        supported = ", ".join(versions) or "none"
        if version not in versions:
            raise PatchError(f"no patches for SGLang {version}; supported versions: {supported}")
        found = installed_version(sglang_dir)
        if found != version:
            raise PatchError(
                f"SGLang in {sglang_dir} is {found}, not {version}; supported versions: {supported}"
            )
        self.version = version
        self.sglang_dir = sglang_dir
        self.targets = self._load(root / f"sglang-{version}", stock_digests(sglang_dir, version))

    def _load(self, folder: Path, digests: dict[str, str]) -> list[TargetFile]:
        targets: list[TargetFile] = []
        seen: dict[str, Path] = {}
        for patch in sorted(folder.glob("*.patch")):
            for diff in unidiff.parse(patch.read_text(encoding="utf-8")):
                if diff.path in seen:
                    raise PatchError(
                        f"{diff.path} is patched by both {seen[diff.path].name} and {patch.name}"
                    )
                if diff.path not in digests:
                    raise PatchError(
                        f"{diff.path} has no hash in SGLang's RECORD: its stock content is unknown"
                    )
                seen[diff.path] = patch
                targets.append(TargetFile(patch, diff, self.sglang_dir / diff.path, digests[diff.path]))
        if not targets:
            raise PatchError(f"{folder} holds no .patch files")
        return targets

    def inspect(self) -> dict[TargetFile, Inspection]:
        return {t: t.inspect() for t in self.targets}

    def status(self) -> str:
        found = self.inspect()
        states = {i.state for i in found.values()}
        if states == {FileState.PATCHED}:
            return "applied"
        if states == {FileState.PRISTINE}:
            return "not applied"
        bad = [f"{t.path} ({i.state.value})" for t, i in found.items() if i.state in _BLOCKING]
        if bad:
            return "foreign changes: " + ", ".join(bad)
        done = [t.diff.path for t, i in found.items() if i.state is FileState.PATCHED]
        return "partially applied: " + ", ".join(done)

    def way_back(self) -> str:
        """How to get stock files back when some are foreign: ends with the exact pip line."""
        return (
            "revert --force-stock (from SGLang's wheel in pip's cache or --wheel PATH), or "
            + reinstall_command(self.sglang_dir, self.version)
        )

    def _plan(self, forward: bool) -> dict[TargetFile, str]:
        """New content for every file that must change; raises if any file blocks the verb."""
        found = self.inspect()
        blocked = [(t, i.state) for t, i in found.items() if i.state in _BLOCKING]
        if blocked:
            names = "; ".join(f"{t.path} ({s.value}, patch {t.patch.name})" for t, s in blocked)
            raise PatchError(f"refused, nothing changed: {names}; back to stock: {self.way_back()}")
        todo = FileState.PRISTINE if forward else FileState.PATCHED
        return {t: i.other for t, i in found.items() if i.state is todo and i.other is not None}

    def check(self, forward: bool = True) -> list[str]:
        """Dry run: the files the verb would change."""
        return [str(t.path) for t in self._plan(forward)]

    def apply(self) -> list[str]:
        return self._change(forward=True)

    def revert(self) -> list[str]:
        return self._change(forward=False)

    def _change(self, forward: bool) -> list[str]:
        return write_files({t.path: content.encode("utf-8") for t, content in self._plan(forward).items()})


def write_files(contents: dict[Path, bytes]) -> list[str]:
    """Write every file or none: each is staged next to its target, then all are renamed into place.
    A file keeps its mode; a missing one is created (0644, with its folders)."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in contents.items():
            mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, mode)
            staged.append((tmp, path))
    except BaseException:
        for tmp, _ in staged:
            os.unlink(tmp)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    return [str(path) for _, path in staged]


_BLOCKING = (FileState.FOREIGN, FileState.MISSING)
