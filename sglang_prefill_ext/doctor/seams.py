"""Where two pieces of shared content meet, for the layout re-runs (`layout`): the tokens from the last
anchor of one piece to the first anchor of the next are the tail of the one (its last anchor to its
end) and the head of the other (its start to its first anchor), and no hash says where one ends.

Each place the log shows two pieces side by side, with nothing between their anchors, gives the sum
of that tail and that head exactly. Those sums are fitted as one tail per piece end and one head per
piece start (a spanning forest of the joins, the shortest first: a join that hides content without
an anchor of its own is longer than the true sum, and is the one left out of the fit); one constant
per connected set of joins stays free (a tail longer, every head it meets shorter: the same sums),
and is set to the lengths anchors give on average: half a block from a start to its first anchor,
a block from the last anchor to the end (the anchored block, and as much again before the next
anchor). A fix that brings two pieces together that the log never shows together gets their sum
from the fit, exactly where both are in one connected set; an end or start of no join gets the
average, at most the shortest stretch the log shows it in."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable

START = "^"  # the end before a part's first piece: no tail
END = "$"  # the start after a part's last piece: no head


@dataclasses.dataclass(frozen=True)
class Join:
    left: str  # the unit that ends a piece (START: none)
    right: str  # the unit that starts the next (END: none)
    tokens: int  # from the left unit's anchor (the part's start) to the right one's (the part's end)
    clean: bool  # nothing between the two anchors but the tail and the head: the sum is exact


class Seams:
    """The fitted tail of each piece end and head of each piece start, in tokens."""

    def __init__(self, joins: Iterable[Join], block: int) -> None:
        self.prior = {"t": block, "h": block // 2}
        joins = list(joins)
        shortest: dict[tuple[str, str], int] = {}
        for j in joins:
            for node in (("t", j.left), ("h", j.right)):
                shortest[node] = min(j.tokens, shortest.get(node, j.tokens))
        self.value: dict[tuple[str, str], int] = self._fit([j for j in joins if j.clean])
        for node, tokens in shortest.items():  # no clean join: the average, as the log bounds it
            self.value.setdefault(node, min(self.prior[node[0]], tokens))

    def _fit(self, joins: list[Join]) -> dict[tuple[str, str], int]:
        root: dict[tuple[str, str], tuple[str, str]] = {}

        def find(node: tuple[str, str]) -> tuple[str, str]:
            root.setdefault(node, node)
            while root[node] != node:
                root[node] = root[root[node]]
                node = root[node]
            return node

        tree: dict[tuple[str, str], list[tuple[tuple[str, str], int]]] = collections.defaultdict(list)
        for j in sorted(joins, key=lambda j: j.tokens):
            t, h = ("t", j.left), ("h", j.right)
            a, b = find(t), find(h)
            if a != b:
                root[a] = b
                tree[t].append((h, j.tokens))
                tree[h].append((t, j.tokens))
        value: dict[tuple[str, str], int] = {}
        for first in list(tree):
            if first in value:
                continue
            value[first] = 0
            component, stack = [first], [first]
            while stack:
                node = stack.pop()
                for other, tokens in tree[node]:
                    if other not in value:
                        value[other] = tokens - value[node]
                        component.append(other)
                        stack.append(other)
            value.update(self._settled(component, value))
        return value

    def _settled(
        self, component: list[tuple[str, str]], value: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], int]:
        """The component's values with its free constant set: a part's own start and end pinned at
        0, else the average lengths (least squares), no tail or head below 0 where the sums allow."""
        tails = [value[n] for n in component if n[0] == "t"]
        heads = [value[n] for n in component if n[0] == "h"]
        fixed = [n for n in component if n in (("t", START), ("h", END))]
        if fixed:
            shift = -value[fixed[0]] if fixed[0][0] == "t" else value[fixed[0]]
        else:
            off = sum(self.prior["t"] - t for t in tails) + sum(h - self.prior["h"] for h in heads)
            shift = min(max(round(off / len(component)), -min(tails)), max(-min(tails), min(heads)))
        return {n: value[n] + shift if n[0] == "t" else value[n] - shift for n in component}

    def tail(self, name: str) -> int:
        return 0 if name == START else self.value.get(("t", name), self.prior["t"])

    def head(self, name: str) -> int:
        return 0 if name == END else self.value.get(("h", name), self.prior["h"])
