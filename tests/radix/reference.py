"""A plain reference model of a prefix cache: a trie of pages per namespace, one slot per token."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class ReferencePrefixCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.roots: dict[Hashable, dict] = {}

    def _pages(self, items: Sequence[int]) -> list[tuple[int, ...]]:
        size = self.page_size
        return [tuple(items[i : i + size]) for i in range(0, len(items) // size * size, size)]

    def longest_prefix(self, namespace: Hashable, tokens: Sequence[int]) -> list[int]:
        """Slots of the longest cached page-aligned prefix."""
        slots: list[int] = []
        level = self.roots.get(namespace, {})
        for page in self._pages(tokens):
            if page not in level:
                break
            page_slots, level = level[page]
            slots.extend(page_slots)
        return slots

    def add(self, namespace: Hashable, tokens: Sequence[int], slots: Sequence[int]) -> None:
        level = self.roots.setdefault(namespace, {})
        for page, page_slots in zip(self._pages(tokens), self._pages(slots), strict=True):
            if page not in level:
                level[page] = (page_slots, {})
            level = level[page][1]

    def drop_slots(self, freed: set[int]) -> None:
        """Forget freed pages; a freed page's descendants must be freed too (leaves go first)."""
        stack = list(self.roots.values())
        while stack:
            level = stack.pop()
            for page, (page_slots, children) in list(level.items()):
                if freed.issuperset(page_slots):
                    assert all_slots(children) <= freed, "evicted a node but kept its descendants"
                    del level[page]
                else:
                    assert freed.isdisjoint(page_slots), "evicted part of a page"
                    stack.append(children)

    def size(self) -> int:
        return sum(len(all_slots(level)) for level in self.roots.values())


def all_slots(level: dict) -> set[int]:
    slots: set[int] = set()
    stack = [level]
    while stack:
        for page_slots, children in stack.pop().values():
            slots.update(page_slots)
            stack.append(children)
    return slots
