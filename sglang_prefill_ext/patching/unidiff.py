"""Exact unified-diff parsing and application (no fuzz), forwards and backwards.

Applying without fuzz is what makes `revert` byte-identical: a hunk either matches the
file exactly (context and removed lines) or the file is reported as changed by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\ No newline at end of file"


class PatchFormatError(ValueError):
    """The patch file itself is malformed."""


@dataclass
class Hunk:
    old_start: int
    old_lines: list[str] = field(default_factory=list)
    new_lines: list[str] = field(default_factory=list)

    def reversed(self) -> Hunk:
        return Hunk(self.old_start, self.new_lines, self.old_lines)


@dataclass
class FileDiff:
    path: str
    hunks: list[Hunk]

    def reversed(self) -> FileDiff:
        return FileDiff(self.path, [h.reversed() for h in self.hunks])


def _strip_prefix(name: str, strip: int) -> str:
    name = name.split("\t", 1)[0].strip()
    parts = name.split("/")
    if len(parts) <= strip:
        raise PatchFormatError(f"cannot strip {strip} components from {name!r}")
    return "/".join(parts[strip:])


def parse(text: str, strip: int = 1) -> list[FileDiff]:
    """Parse a unified diff into per-file hunks; paths are stripped like `patch -pN`."""
    lines = text.splitlines(keepends=True)
    diffs: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchFormatError(f"line {i + 1}: '---' not followed by '+++'")
        old_name, new_name = line[4:], lines[i + 1][4:]
        if old_name.startswith("/dev/null") or new_name.startswith("/dev/null"):
            raise PatchFormatError("patches may only modify existing files")
        current = FileDiff(_strip_prefix(new_name, strip), [])
        diffs.append(current)
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            i = _parse_hunk(lines, i, current)
    if not diffs:
        raise PatchFormatError("no file differences found")
    return diffs


def _parse_hunk(lines: list[str], i: int, into: FileDiff) -> int:
    header = _HUNK_HEADER.match(lines[i])
    if not header:
        raise PatchFormatError(f"line {i + 1}: bad hunk header {lines[i]!r}")
    old_count = int(header.group(2) or 1)
    new_count = int(header.group(4) or 1)
    hunk = Hunk(int(header.group(1)))
    i += 1
    while old_count > 0 or new_count > 0:
        if i >= len(lines):
            raise PatchFormatError("patch ends inside a hunk")
        tag, body = lines[i][:1], lines[i][1:]
        if tag == " " or lines[i] in ("\n", "\r\n"):
            body = body if tag == " " else lines[i]
            hunk.old_lines.append(body)
            hunk.new_lines.append(body)
            old_count -= 1
            new_count -= 1
        elif tag == "-":
            hunk.old_lines.append(body)
            old_count -= 1
        elif tag == "+":
            hunk.new_lines.append(body)
            new_count -= 1
        else:
            raise PatchFormatError(f"line {i + 1}: unexpected {lines[i]!r} inside a hunk")
        i += 1
        i = _absorb_no_newline(lines, i, hunk, tag)
    if old_count < 0 or new_count < 0:
        raise PatchFormatError(f"hunk at line {hunk.old_start} has wrong line counts")
    into.hunks.append(hunk)
    return i


def _absorb_no_newline(lines: list[str], i: int, hunk: Hunk, tag: str) -> int:
    if i < len(lines) and lines[i].rstrip("\r\n") == _NO_NEWLINE:
        targets = {" ": (hunk.old_lines, hunk.new_lines), "-": (hunk.old_lines,), "+": (hunk.new_lines,)}
        for target in targets.get(tag, ()):
            target[-1] = target[-1].rstrip("\r\n")
        return i + 1
    return i


def apply(diff: FileDiff, content: str) -> str | None:
    """Return `content` with every hunk applied, or None if any hunk does not match exactly."""
    lines = content.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for hunk in diff.hunks:
        at = _locate(lines, hunk, pos)
        if at is None:
            return None
        out.extend(lines[pos:at])
        out.extend(hunk.new_lines)
        pos = at + len(hunk.old_lines)
    out.extend(lines[pos:])
    return "".join(out)


def _locate(lines: list[str], hunk: Hunk, lowest: int) -> int | None:
    """Where the hunk's old lines stand: at the stated line, else the nearest exact match."""
    size = len(hunk.old_lines)
    expected = max(hunk.old_start - 1, lowest) if size else hunk.old_start
    candidates = sorted(range(lowest, len(lines) - size + 1), key=lambda at: abs(at - expected))
    for at in candidates:
        if lines[at : at + size] == hunk.old_lines:
            return at
    return None
