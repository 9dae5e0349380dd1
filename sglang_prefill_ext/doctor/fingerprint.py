"""Prompt fingerprints (`--prefill-ext-log-fingerprints`): keyed hashes of a prompt's token blocks,
enough to say where two prompts stop sharing and which of their blocks recur elsewhere, and no
token ids.

Two kinds of fixed-size blocks, each hashed with 64-bit BLAKE2b keyed by the salt:

- grid blocks: tokens [i * block, (i + 1) * block), every full block (the positions a prefix cache
  matches, page-aligned): two prompts share a cached prefix as far as their grid hashes agree;
- anchored blocks of `block // 2` tokens starting at content-defined anchors: positions whose next
  `WINDOW` tokens hash to 0 modulo `block // 2` (one anchor every `block // 2` tokens on average).
  The same tokens give the same anchors wherever they sit, so a document moved by any number of
  tokens still shows, where the grid (which only sees shifts by whole blocks) would not.
"""

from __future__ import annotations

import dataclasses
import hashlib
from array import array
from typing import Any

import numpy as np

WINDOW = 16  # tokens deciding whether a position is an anchor
DIGEST_BYTES = 8
MIN_BLOCK = 2 * WINDOW  # an anchored block holds the window that anchors it
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    blocks: list[str]  # hex digest of each full grid block
    anchors: list[int]  # offset of each anchored block
    anchored: list[str]  # hex digest of each anchored block


def hash_key(salt: str) -> bytes:
    """The BLAKE2b key of `salt` (empty: unkeyed)."""
    return hashlib.blake2b(salt.encode(), digest_size=32).digest() if salt else b""


def packed(token_ids: Any) -> np.ndarray:
    """The ids as uint32 (4 bytes hashed per token; any id of a real vocabulary fits), else as int64."""
    try:
        return np.frombuffer(array("I", token_ids), dtype=np.uint32)
    except OverflowError:  # an id outside [0, 2**32): validation refuses those before they get here
        return np.asarray(token_ids, dtype=np.int64)


def anchor_offsets(tokens: np.ndarray, length: int, key: bytes) -> np.ndarray:
    """Offsets a whose window [a, a + WINDOW) hashes to 0 modulo `length`, with a + length inside."""
    last = len(tokens) - length
    if last < 0:
        return np.empty(0, dtype=np.int64)
    mixed = tokens.astype(np.uint64)
    mixed += np.uint64(int.from_bytes(key[:8] or b"\0", "little"))
    mixed *= _MIX[0]
    mixed ^= mixed >> np.uint64(31)
    mixed *= _MIX[1]
    sums = np.cumsum(mixed)  # wraps modulo 2**64, as the window differences below expect
    windows = sums[WINDOW - 1 : WINDOW + last].copy()
    windows[1:] -= sums[:last]
    windows *= _MIX[2]
    # the high 32 bits scaled to [0, length): 0 with probability 1 / length
    return np.flatnonzero((windows >> np.uint64(32)) * np.uint64(length) >> np.uint64(32) == 0)


def fingerprint(token_ids: Any, block: int, salt: str) -> Fingerprint:
    """The fingerprint of a prompt (a sequence of ints: a list, an array('q'), ...)."""
    tokens = packed(token_ids)
    data = memoryview(tokens).cast("B")
    width = tokens.itemsize
    keyed = hashlib.blake2b(digest_size=DIGEST_BYTES, key=hash_key(salt))

    def digest(start: int, length: int) -> str:
        h = keyed.copy()  # cheaper than keying a new hash per block
        h.update(data[start * width : (start + length) * width])
        return h.hexdigest()

    half = block // 2
    anchors = anchor_offsets(tokens, half, hash_key(salt)).tolist()
    return Fingerprint(
        blocks=[digest(start, block) for start in range(0, len(tokens) - block + 1, block)],
        anchors=anchors,
        anchored=[digest(start, half) for start in anchors],
    )
