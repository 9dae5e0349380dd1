"""Which prompt extends which: a conversation's next turn holds its previous prompt whole, in front.
Such a prompt's history cannot be laid out anew (`layout` keeps it), and content that recurs only in
the same conversation's later turns is not shared between requests (`analysis`).

The fingerprint cannot show the end of a prompt that no anchored block covers (its last tokens after
its last full grid block), so the server's own hit decides there: a request whose hit stops short of
a cached prompt's end, or came from a cached prompt that does not hold it, does not extend it."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

from sglang_prefill_ext.doctor.log import Request

SOURCES = 16  # the latest prompts remembered per grid block: where a request's hit may have come from


class _Node:
    __slots__ = ("children", "ends", "through")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.ends: list[int] = []  # the requests whose full grid blocks end here
        self.through: collections.deque[int] = collections.deque(maxlen=SOURCES)  # ... that pass here


def page(requests: Sequence[Request]) -> int:
    """The server's page size as its hits show it (a hit is a whole number of pages): the largest power
    of two up to the fingerprint block dividing every hit."""
    hits = math.gcd(*(r.cached for r in requests))
    block = requests[0].fp.block if requests else 1  # type: ignore[union-attr]
    size = 1
    while size < block and hits % (2 * size) == 0:
        size *= 2
    return size


def _cached(earlier: Request, request: Request) -> bool:
    return earlier.fp.end_ms <= request.fp.start_ms  # type: ignore[union-attr]


def _extends(request: Request, earlier: Request, page: int) -> bool:
    """`request` holds all of `earlier`'s prompt in front: its grid blocks (checked by the caller) and
    the anchored blocks of its last, partial block, at the same offsets; and the server, holding
    `earlier` when `request` came, did not stop matching inside that last block."""
    if earlier.input_len > request.input_len:
        return False
    fp, old = request.fp, earlier.fp
    assert fp is not None and old is not None
    grid_end = len(old.blocks) * old.block
    if _cached(earlier, request) and grid_end <= request.cached < earlier.input_len // page * page:
        return False
    tail = grid_end - old.block // 2
    mine = set(zip(fp.anchors, fp.anchored, strict=True))
    return all((a, h) in mine for a, h in zip(old.anchors, old.anchored, strict=True) if a >= tail)


def parents(requests: Sequence[Request]) -> list[int | None]:
    """For each fingerprinted request (in start order), the latest, longest earlier request whose whole
    prompt it extends (its previous turn), else None."""
    root, size = _Node(), page(requests)
    found: list[int | None] = []
    for index, request in enumerate(requests):
        assert request.fp is not None
        path = [root]
        for h in request.fp.blocks:
            child = path[-1].children.get(h)
            if child is None:
                break
            path.append(child)
        sources = _sources(requests, index, path)
        parent = None
        for node in path[1:]:
            for earlier in reversed(node.ends):
                if _extends(request, requests[earlier], size) and (
                    sources is None
                    or request.cached <= requests[earlier].input_len + requests[earlier].output
                    or any(related(found, s, earlier) for s in sources)
                ):
                    parent = earlier
                    break
        found.append(parent)
        node = root
        for h in request.fp.blocks:
            node = node.children.setdefault(h, _Node())
            node.through.append(index)
        if request.fp.blocks:
            node.ends.append(index)
    return found


def _sources(requests: Sequence[Request], index: int, path: list[_Node]) -> list[int] | None:
    """The cached prompts requests[index]'s hit may have come from: the latest holding its grid blocks
    within the hit and as many tokens (with their output) as it; None where the log shows none."""
    request = requests[index]
    depth = request.cached // request.fp.block  # type: ignore[union-attr]
    if depth >= len(path) or depth == 0:
        return None
    found = [
        s
        for s in path[depth].through
        if requests[s].input_len + requests[s].output >= request.cached and _cached(requests[s], request)
    ]
    return found or None


def related(parent: Sequence[int | None], a: int, b: int) -> bool:
    """Whether one of requests a, b extends the other, through any number of turns."""
    earlier, later = min(a, b), max(a, b)
    node: int | None = later
    while node is not None and node > earlier:
        node = parent[node]
    return node == earlier
