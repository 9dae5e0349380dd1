#!/usr/bin/env python3
"""Join fa3's parts (scripts/gpu/make_fa3_parts.sh) into sgl_kernel/flash_ops.abi3.so.

    python3 bench/gpu/fa3_join.py PARTS_DIR DEST_SO

PARTS_DIR holds PARTS (the part names, in order), SHA256 (of their concatenation, a zstd stream)
and the parts. Missing parts: says which and exits 3, writing nothing. A checksum mismatch: exits 4,
writing nothing. Needs the `zstandard` module (its wheel travels with the first part).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import zstandard


def main(parts_dir: str, dest: str) -> int:
    folder, target = Path(parts_dir), Path(dest)
    names = (folder / "PARTS").read_text().split()
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        print(f"fa3: {len(names) - len(missing)}/{len(names)} parts here, waiting for {' '.join(missing)}")
        return 3
    digest = hashlib.sha256()
    for name in names:
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    want = (folder / "SHA256").read_text().strip()
    if digest.hexdigest() != want:
        print(f"fa3: sha256 of the joined parts {digest.hexdigest()} != {want}: not installed")
        return 4
    tmp = target.with_suffix(".partial")
    decompressor = zstandard.ZstdDecompressor()
    with open(tmp, "wb") as out:
        decompressor.copy_stream(_Concat([folder / n for n in names]), out)
    os.replace(tmp, target)
    print(f"fa3: {target} installed ({target.stat().st_size:,} bytes, sha256 of parts checked)")
    return 0


class _Concat:
    """A readable stream over several files, one after another."""

    def __init__(self, paths: list[Path]) -> None:
        self._files = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed as they run out

    def read(self, size: int = -1) -> bytes:
        while self._files:
            block = self._files[0].read(size)
            if block:
                return block
            self._files.pop(0).close()
        return b""


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
