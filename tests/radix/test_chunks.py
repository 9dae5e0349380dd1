"""The chunk store on the version-free PrefixTree: exact keys, positions, locks, one eviction order."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_prefill_ext.radix import PrefixTree
from sglang_prefill_ext.radix.eviction import POLICIES


def tokens(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int64)


def slots(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.int64)


def test_a_chunk_is_hit_by_exactly_its_tokens_in_its_namespace() -> None:
    tree = PrefixTree()
    chunk = tree.query(tokens(5, 6, 7, 8))
    outcome = tree.chunks.insert(chunk, slots(100, 4), position=40)
    assert outcome.stored and (outcome.entry.depth, outcome.entry.end) == (40, 44)
    hit = tree.chunks.match(tree.query(tokens(5, 6, 7, 8)))
    assert hit is outcome.entry and hit.value.tolist() == [100, 101, 102, 103]
    for other in [tokens(5, 6, 7), tokens(5, 6, 7, 8, 9), tokens(5, 6, 7, 9), tokens(6, 7, 8)]:
        assert tree.chunks.match(tree.query(other)) is None
    assert tree.chunks.match(tree.query(tokens(5, 6, 7, 8), "lora-a")) is None
    assert tree.match(tree.query(tokens(5, 6, 7, 8))).length == 0, "a chunk is no prefix"


def test_the_store_keeps_a_copy_and_a_second_insert_keeps_the_first() -> None:
    tree = PrefixTree()
    value = slots(10, 3)
    first = tree.chunks.insert(tree.query(tokens(1, 2, 3)), value, position=0)
    value[:] = -1
    again = tree.chunks.insert(tree.query(tokens(1, 2, 3)), slots(50, 3), position=7)
    assert not again.stored and again.entry is first.entry
    assert first.entry.value.tolist() == [10, 11, 12] and first.entry.depth == 0
    assert (tree.cached_tokens, tree.evictable_tokens, len(tree.chunks)) == (3, 3, 1)


def test_pages_cut_a_chunk_to_whole_pages() -> None:
    tree = PrefixTree(page_size=4)
    entry = tree.chunks.insert(tree.query(tokens(*range(10))), slots(0, 10), position=3).entry
    assert entry.size == 8 and entry.value.tolist() == list(range(8))
    assert tree.chunks.match(tree.query(tokens(*range(8), 99))) is entry
    with pytest.raises(ValueError, match="at least one page"):
        tree.chunks.insert(tree.query(tokens(1, 2, 3)), slots(0, 3), position=0)
    with pytest.raises(ValueError, match="position must be >= 0"):
        tree.chunks.insert(tree.query(tokens(*range(4))), slots(0, 4), position=-1)


def test_locks_move_tokens_between_evictable_and_protected() -> None:
    tree = PrefixTree()
    entry = tree.chunks.insert(tree.query(tokens(1, 2, 3)), slots(0, 3), position=0).entry
    assert tree.chunks.lock(entry) == -3 and tree.chunks.lock(entry) == 0
    assert (tree.evictable_tokens, tree.protected_tokens) == (0, 3)
    assert tree.evict(10) == []
    assert tree.chunks.unlock(entry) == 0 and tree.chunks.unlock(entry) == 3
    assert (tree.evictable_tokens, tree.protected_tokens) == (3, 0)
    with pytest.raises(RuntimeError, match="unlock of an unlocked chunk"):
        tree.chunks.unlock(entry)


def test_chunks_and_leaves_go_in_one_lru_order_and_a_chunk_goes_whole() -> None:
    tree = PrefixTree(eviction="lru")
    old_chunk = tree.chunks.insert(tree.query(tokens(1, 2, 3, 4)), slots(0, 4), position=0).entry
    tree.insert(tree.query(tokens(9, 9)), slots(10, 2))
    new_chunk = tree.chunks.insert(tree.query(tokens(5, 6)), slots(20, 2), position=8).entry
    tree.chunks.match(tree.query(tokens(1, 2, 3, 4)))  # now the most recent
    evicted = tree.evict(1)
    assert [node.value.tolist() for node in evicted] == [[10, 11]]
    evicted = tree.evict(1)
    assert evicted == [new_chunk] and not new_chunk.alive
    assert tree.evict(1) == [old_chunk] and old_chunk.size == 4
    assert (tree.cached_tokens, tree.evictable_tokens, len(tree.chunks)) == (0, 0, 0)
    assert tree.counters.evicted_tokens == 8
    with pytest.raises(RuntimeError, match="lock of an evicted chunk"):
        tree.chunks.lock(old_chunk)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_keys_chunks_beside_leaves(policy: str) -> None:
    tree = PrefixTree(eviction=policy)
    tree.insert(tree.query(tokens(1, 2)), slots(0, 2))
    entry = tree.chunks.insert(tree.query(tokens(3, 4)), slots(2, 2), position=2).entry
    tree.chunks.lock(entry)
    tree.chunks.unlock(entry)
    evicted = tree.evict(4)
    assert entry in evicted and sorted(n.value.tolist() for n in evicted) == [[0, 1], [2, 3]]
    assert (tree.cached_tokens, tree.evictable_tokens, len(tree.chunks)) == (0, 0, 0)


def test_reset_forgets_the_chunks() -> None:
    tree = PrefixTree()
    entry = tree.chunks.insert(tree.query(tokens(1, 2)), slots(0, 2), position=0).entry
    tree.reset()
    assert not entry.alive and len(tree.chunks) == 0 and tree.cached_tokens == 0
    assert tree.chunks.match(tree.query(tokens(1, 2))) is None
