"""Apply, revert and inspect one SGLang version's patch set on an installed `sglang/` tree.

Every verb first computes the outcome for every target file in memory; files are written only
when all of them can change, so a refused call leaves the tree untouched.
"""

from __future__ import annotations

import enum
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_prefill_ext.patching import unidiff

# Package data: found next to the installed package, editable or not.
PATCHES_ROOT = Path(__file__).resolve().parents[1] / "patches"


class PatchError(RuntimeError):
    """A verb was refused; nothing was written."""


class FileState(enum.Enum):
    PRISTINE = "not applied"
    PATCHED = "applied"
    FOREIGN = "changed by hand"
    MISSING = "missing"


@dataclass(frozen=True, eq=False)
class TargetFile:
    patch: Path
    diff: unidiff.FileDiff
    path: Path

    def read(self) -> str | None:
        if not self.path.is_file():
            return None
        with open(self.path, encoding="utf-8", newline="") as f:
            return f.read()

    def state(self) -> FileState:
        content = self.read()
        if content is None:
            return FileState.MISSING
        if unidiff.apply(self.diff, content) is not None:
            return FileState.PRISTINE
        if unidiff.apply(self.diff.reversed(), content) is not None:
            return FileState.PATCHED
        return FileState.FOREIGN


def supported_versions(root: Path | None = None) -> list[str]:
    root = root or PATCHES_ROOT
    found = [p.name.removeprefix("sglang-") for p in root.glob("sglang-*") if p.is_dir()]
    return sorted(found, key=_version_key)


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))


def installed_sglang_dir() -> Path:
    """The folder holding the `sglang/` package that the active Python imports."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("no sglang package is importable by this Python; pass SGLANG_DIR")
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


class PatchSet:
    """The patches of one SGLang version, bound to one installed tree."""

    def __init__(self, version: str, sglang_dir: Path, root: Path | None = None):
        root = root or PATCHES_ROOT
        supported = supported_versions(root)
        if version not in supported:
            raise PatchError(
                f"no patches for SGLang {version}; supported versions: {', '.join(supported) or 'none'}"
            )
        found = installed_version(sglang_dir)
        if found != version:
            raise PatchError(
                f"SGLang in {sglang_dir} is {found}, not {version}; "
                f"supported versions: {', '.join(supported)}"
            )
        self.version = version
        self.sglang_dir = sglang_dir
        self.targets = self._load(root / f"sglang-{version}")

    def _load(self, folder: Path) -> list[TargetFile]:
        targets: list[TargetFile] = []
        seen: dict[str, Path] = {}
        for patch in sorted(folder.glob("*.patch")):
            for diff in unidiff.parse(patch.read_text(encoding="utf-8")):
                if diff.path in seen:
                    raise PatchError(
                        f"{diff.path} is patched by both {seen[diff.path].name} and {patch.name}"
                    )
                seen[diff.path] = patch
                targets.append(TargetFile(patch, diff, self.sglang_dir / diff.path))
        if not targets:
            raise PatchError(f"{folder} holds no .patch files")
        return targets

    def states(self) -> dict[TargetFile, FileState]:
        return {t: t.state() for t in self.targets}

    def status(self) -> str:
        states = self.states()
        kinds = set(states.values())
        if kinds == {FileState.PATCHED}:
            return "applied"
        if kinds == {FileState.PRISTINE}:
            return "not applied"
        bad = [
            f"{t.diff.path} ({s.value})"
            for t, s in states.items()
            if s in (FileState.FOREIGN, FileState.MISSING)
        ]
        if bad:
            return "foreign changes: " + ", ".join(bad)
        done = [t.diff.path for t, s in states.items() if s is FileState.PATCHED]
        return "partially applied: " + ", ".join(done)

    def _plan(self, forward: bool) -> dict[TargetFile, str]:
        """New content for every file that must change; raises if any file blocks the verb."""
        states = self.states()
        blocked = [(t, s) for t, s in states.items() if s in (FileState.FOREIGN, FileState.MISSING)]
        if blocked:
            names = "; ".join(f"{t.path} ({s.value}, patch {t.patch.name})" for t, s in blocked)
            raise PatchError(f"refused, nothing changed: {names}")
        todo = FileState.PRISTINE if forward else FileState.PATCHED
        plan: dict[TargetFile, str] = {}
        for target, state in states.items():
            if state is todo:
                diff = target.diff if forward else target.diff.reversed()
                new = unidiff.apply(diff, target.read() or "")
                assert new is not None  # state() just proved it applies
                plan[target] = new
        return plan

    def check(self, forward: bool = True) -> list[str]:
        """Dry run: the files the verb would change."""
        return [str(t.path) for t in self._plan(forward)]

    def apply(self) -> list[str]:
        return self._write(self._plan(forward=True))

    def revert(self) -> list[str]:
        return self._write(self._plan(forward=False))

    @staticmethod
    def _write(plan: dict[TargetFile, str]) -> list[str]:
        staged: list[tuple[str, Path]] = []
        try:
            for target, content in plan.items():
                fd, tmp = tempfile.mkstemp(dir=target.path.parent, prefix=f".{target.path.name}.")
                with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                    f.write(content)
                os.chmod(tmp, target.path.stat().st_mode & 0o7777)
                staged.append((tmp, target.path))
        except BaseException:
            for tmp, _ in staged:
                os.unlink(tmp)
            raise
        for tmp, path in staged:
            os.replace(tmp, path)
        return [str(path) for _, path in staged]
