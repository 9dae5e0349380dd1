"""Prompt fingerprints: grid blocks match where prompts share a prefix, anchored blocks wherever the
same tokens recur, the salt keys every hash, and no token id is written."""

from __future__ import annotations

import random
from array import array

from sglang_prefill_ext.doctor.fingerprint import fingerprint

BLOCK = 256


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 128000) for _ in range(n)]


def test_grid_blocks_agree_up_to_the_divergence() -> None:
    rng = random.Random(0)
    shared = _ids(rng, 3 * BLOCK + 100)
    a = fingerprint(shared + _ids(rng, 1000), BLOCK, "")
    b = fingerprint(shared + _ids(rng, 1000), BLOCK, "")
    assert len(a.blocks) == len(b.blocks) == (3 * BLOCK + 1100) // BLOCK
    assert a.blocks[:3] == b.blocks[:3]
    assert not set(a.blocks[3:]) & set(b.blocks[3:])


def test_anchored_blocks_find_content_moved_by_any_offset() -> None:
    rng = random.Random(1)
    doc = _ids(rng, 5000)
    for shift in (1, 37, 300):
        a = fingerprint(_ids(rng, 100) + doc, BLOCK, "s")
        b = fingerprint(_ids(rng, 100 + shift) + doc, BLOCK, "s")
        at = dict(zip(a.anchored, a.anchors, strict=True))
        pairs = [(at[h], offset) for offset, h in zip(b.anchors, b.anchored, strict=True) if h in at]
        assert len(pairs) >= 5000 // BLOCK  # about one anchor per half block
        assert {offset - earlier for earlier, offset in pairs} == {shift}
        # the grid sees no shared block unless the shift is a whole number of blocks
        assert not set(a.blocks) & set(b.blocks)


def test_the_salt_keys_every_hash_and_the_input_type_does_not_matter() -> None:
    ids = _ids(random.Random(2), 4 * BLOCK)
    plain, salted = fingerprint(ids, BLOCK, ""), fingerprint(ids, BLOCK, "deployment-a")
    assert fingerprint(array("q", ids), BLOCK, "") == plain
    assert salted.anchored and not set(plain.blocks + plain.anchored) & set(salted.blocks + salted.anchored)
    assert fingerprint(ids, BLOCK, "deployment-a") == salted


def test_hashes_only() -> None:
    ids = _ids(random.Random(3), 2 * BLOCK + 17)
    fp = fingerprint(ids, BLOCK, "")
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in fp.blocks + fp.anchored)
    assert all(0 <= a <= len(ids) - BLOCK // 2 for a in fp.anchors)
    assert fingerprint(ids[: BLOCK - 1], BLOCK, "").blocks == []
