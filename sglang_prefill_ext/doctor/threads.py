"""Which prompt extends which: a conversation's next turn holds its previous prompt whole, in front.
Such a prompt's history cannot be laid out anew (`layout` keeps it), and content that recurs only in
the same conversation's later turns is not shared between requests (`analysis`)."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_prefill_ext.doctor.log import Request


class _Node:
    __slots__ = ("children", "ends")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.ends: list[int] = []  # the requests whose full grid blocks end here


def _extends(request: Request, earlier: Request) -> bool:
    """`request` holds all of `earlier`'s prompt in front: its grid blocks (checked by the caller) and
    the anchored blocks of its last, partial block, at the same offsets."""
    if earlier.input_len > request.input_len:
        return False
    fp, old = request.fp, earlier.fp
    assert fp is not None and old is not None
    tail = len(old.blocks) * old.block - old.block // 2
    mine = set(zip(fp.anchors, fp.anchored, strict=True))
    return all((a, h) in mine for a, h in zip(old.anchors, old.anchored, strict=True) if a >= tail)


def parents(requests: Sequence[Request]) -> list[int | None]:
    """For each fingerprinted request (in start order), the latest, longest earlier request whose whole
    prompt it extends (its previous turn), else None."""
    root = _Node()
    found: list[int | None] = []
    for index, request in enumerate(requests):
        assert request.fp is not None
        node, parent = root, None
        for h in request.fp.blocks:
            child = node.children.get(h)
            if child is None:
                break
            node = child
            for earlier in reversed(node.ends):
                if _extends(request, requests[earlier]):
                    parent = earlier
                    break
        found.append(parent)
        node = root
        for h in request.fp.blocks:
            node = node.children.setdefault(h, _Node())
        if request.fp.blocks:
            node.ends.append(index)
    return found


def related(parent: Sequence[int | None], a: int, b: int) -> bool:
    """Whether one of requests a, b extends the other, through any number of turns."""
    earlier, later = min(a, b), max(a, b)
    node: int | None = later
    while node is not None and node > earlier:
        node = parent[node]
    return node == earlier
