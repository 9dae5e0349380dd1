"""What a layout fix saves, by re-running one log's own traffic with the fix applied: the same prompts,
in the same order and timing (`timeline`), against an unbounded prefix cache of content units
(`units`), once as logged and once per fix; a request's saving is its cache hit with the fix less its
hit as logged.

The fixes, each applied on top of the one before:
- `dynamic`: what differs per request (units no other conversation holds) moved to the end;
- `reordered`: the shared content besides in one stable order, the order it was first seen in. The
  units where two documents meet (a valley: held by fewer requests than the content on both sides)
  are left out of the order.

Where a fix brings together content that was apart, the tokens at the seam (the end of one piece and
the start of the next, which no unit of their own names) count as a seam unit named by the two
pieces, of the length of what the fix took out from between them, at most `SEAM` tokens: the seam
of two documents counts, the content taken out does not. A conversation's next turn keeps its
previous prompt in front, fixed as that turn was: only what the turn appends is laid out anew
(`threads`)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from sglang_prefill_ext.doctor import threads, timeline
from sglang_prefill_ext.doctor.log import Request
from sglang_prefill_ext.doctor.units import Unit, own, units

FIXES = ("dynamic", "reordered")
START = "^"  # the name before a prompt's (or an appended part's) first unit

Key = tuple[int, int]  # (request, offset) where a unit was first seen


@dataclasses.dataclass(frozen=True)
class Savings:
    """Per request (in start order): the tokens each fix adds to its cache hit (negative: loses)."""

    dynamic: list[int]
    reordered: list[int]


class _Traffic:
    """One log's prompts as units, and what the fixes need to know of them."""

    def __init__(self, requests: Sequence[Request], parent: list[int | None]) -> None:
        self.requests = requests
        self.parent = parent
        self.prompts = [units(index, r) for index, r in enumerate(requests)]
        block = requests[0].fp.block if requests else 0  # type: ignore[union-attr]
        self.seam = block
        held: dict[str, list[int]] = collections.defaultdict(list)
        self.after: dict[str, set[str]] = collections.defaultdict(set)
        self.first: dict[tuple[str, int], Key] = {}
        self.shortest: dict[str, int] = {}
        for index, prompt in enumerate(self.prompts):
            copies: collections.Counter[str] = collections.Counter()
            previous = START
            for u in prompt:
                if not held[u.name] or held[u.name][-1] != index:
                    held[u.name].append(index)
                self.after[previous].add(u.name)
                previous = u.name
                copies[u.name] += 1  # a repeat within a prompt keeps its place after the copies before it
                self.first.setdefault((u.name, copies[u.name]), (index, u.start))
        self.held = {name: frozenset(held_by) for name, held_by in held.items()}
        for prompt in self.prompts:  # a unit cut short by a seam's own anchor does not count
            for u, following in zip(prompt, prompt[1:], strict=False):
                if not self.held[following.name] < self.held[u.name]:
                    self.shortest[u.name] = min(u.length, self.shortest.get(u.name, u.length))
        self.shared = {
            name
            for name, held_by in held.items()
            if any(not threads.related(parent, a, b) for a, b in zip(held_by, held_by[1:], strict=False))
        }

    def valleys(self, prompt: list[Unit]) -> set[Unit]:
        """The units where two pieces of shared content meet: held only by requests that hold the
        nearest differently held unit on either side, and by fewer (their anchored block straddles)."""
        held = [self.held[u.name] for u in prompt]
        left: list[frozenset[int] | None] = [None] * len(held)
        right: list[frozenset[int] | None] = [None] * len(held)
        for i in range(1, len(held)):
            left[i] = held[i - 1] if held[i - 1] != held[i] else left[i - 1]
        for i in range(len(held) - 2, -1, -1):
            right[i] = held[i + 1] if held[i + 1] != held[i] else right[i + 1]
        return {
            prompt[i]
            for i, h in enumerate(held)
            if left[i] is not None and right[i] is not None and h < left[i] and h < right[i]  # type: ignore[operator]
        }

    def arranged(
        self,
        index: int,
        part: list[Unit],
        taken: Callable[[Unit], bool],
        key: Callable[[Unit, int], Key] | None,
    ) -> list[Unit]:
        """`part` of requests[index]'s prompt with the units `taken` moved to the end, where they are
        this request's own, and the rest (in `key` order when given); between two kept units the log
        does not always show together, their seam (its tokens taken from what moved: the part keeps
        its length). A unit the log shows before different units
        keeps the length it has everywhere (its shortest, before a unit held as widely or more):
        the rest is the start of what followed it here, and goes to the seam after it."""
        kept: list[tuple[Key, Unit, int, int]] = []  # (key, unit, tokens taken out before, carried after)
        gap, copies = 0, collections.Counter[str]()
        for u in part:
            copies[u.name] += 1
            if taken(u):
                gap += u.length
                continue
            carried = (
                max(0, u.length - self.shortest.get(u.name, u.length)) if len(self.after[u.name]) > 1 else 0
            )
            order = key(u, copies[u.name]) if key is not None else (0, 0)
            kept.append((order, Unit(u.name, u.start, u.length - carried), gap, carried))
            gap = 0
        if key is not None:
            kept.sort(key=lambda k: k[0])
        out: list[Unit] = []
        previous, carry, drawn = START, 0, 0
        for _, u, before, carried in kept:
            if self.after[previous] != {u.name}:
                seam = min(carry + before, self.seam)
                drawn += max(0, seam - carry)  # what the seam takes from the content moved out
                out.append(Unit(f"j:{previous}>{u.name}", u.start, seam))
            out.append(u)
            previous, carry = u.name, carried
        rest = sum(u.length for u in part if taken(u)) - drawn  # the same tokens in all: this request's own
        return [*out, Unit(own(index, part[-1].start), part[-1].start, rest)] if rest > 0 else out

    def rebuilt(self, arrange: Callable[[int, list[Unit]], list[Unit]]) -> list[list[Unit]]:
        """Each prompt with what it appends to its previous turn (all of it, for a first turn) laid out
        by `arrange(index, units)`, behind its previous turn as rebuilt."""
        rebuilt: list[list[Unit]] = []
        for index, prompt in enumerate(self.prompts):
            p = self.parent[index]
            if p is None:
                rebuilt.append(arrange(index, prompt))
                continue
            cut = self.requests[p].input_len
            appended = [u for u in prompt if u.start >= cut]
            straddling = [u for u in prompt if u.start < cut < u.start + u.length]
            if straddling:  # the rest of a unit that began in the previous turn: new content
                u = straddling[0]
                appended.insert(0, Unit(own(index, cut), cut, u.start + u.length - cut))
            rebuilt.append(rebuilt[p] + arrange(index, appended))
        return rebuilt


def _hits(requests: Sequence[Request], flushes: Sequence[float], prompts: list[list[Unit]]) -> list[int]:
    """Each request's prefix-cache hit (tokens) with these prompts, in the log's order and timing."""
    root: dict = {}
    hits = [0] * len(prompts)
    for event, index in timeline.events(requests, flushes):
        if event == "flush":
            root = {}
        elif event == "cache":
            node = root
            for u in prompts[index]:
                node = node.setdefault(u.name, {})
        else:
            node, hit = root, 0
            for u in prompts[index]:
                if u.name not in node:
                    break
                node, hit = node[u.name], hit + u.length
            hits[index] = hit
    return hits


def savings(requests: Sequence[Request], flushes: Sequence[float], parent: list[int | None]) -> Savings:
    """What each fix saves each request of one log (every request fingerprinted, in start order;
    `parent`: `threads.parents`)."""
    traffic = _Traffic(requests, parent)

    def as_logged(index: int, part: list[Unit]) -> list[Unit]:
        return traffic.arranged(index, part, lambda u: False, None)

    def dynamic_last(index: int, part: list[Unit]) -> list[Unit]:
        return traffic.arranged(index, part, lambda u: u.name not in traffic.shared, None)

    def stable_order(index: int, part: list[Unit]) -> list[Unit]:
        valleys = traffic.valleys(traffic.prompts[index])
        return traffic.arranged(
            index,
            part,
            lambda u: u.name not in traffic.shared or u in valleys,
            lambda u, copy: traffic.first.get((u.name, copy), (index, u.start)),
        )

    # content with no anchor of its own hides in the unit before it: where the server's cache stopped
    # at a grid block no other request holds (content of this request's own), no hit beyond it counts
    grid = collections.Counter((i, h) for r in requests for i, h in enumerate(r.fp.blocks))  # type: ignore[union-attr]

    def own_from(r: Request) -> bool:
        i = r.cached // traffic.seam
        return i < len(r.fp.blocks) and grid[(i, r.fp.blocks[i])] == 1  # type: ignore[union-attr]

    logged = [
        min(hit, r.cached + traffic.seam) if own_from(r) else hit
        for hit, r in zip(_hits(requests, flushes, traffic.rebuilt(as_logged)), requests, strict=True)
    ]
    dynamic = _hits(requests, flushes, traffic.rebuilt(dynamic_last))
    stable = _hits(requests, flushes, traffic.rebuilt(stable_order))
    return Savings(
        [d - h for d, h in zip(dynamic, logged, strict=True)],
        [s - d for s, d in zip(stable, dynamic, strict=True)],
    )
