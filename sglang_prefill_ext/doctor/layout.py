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
        self.seam = requests[0].fp.block if requests else 0  # type: ignore[union-attr]
        held: dict[str, list[int]] = collections.defaultdict(list)
        self.after: dict[str, set[str]] = collections.defaultdict(set)
        self.first: dict[tuple[str, int], Key] = {}
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
        self.holders = {name: len(held_by) for name, held_by in held.items()}
        self.shared = {
            name
            for name, held_by in held.items()
            if any(not threads.related(parent, a, b) for a, b in zip(held_by, held_by[1:], strict=False))
        }

    def valleys(self, prompt: list[Unit]) -> set[Unit]:
        """The units held by fewer requests than the nearest differently held unit on both sides:
        where two pieces of shared content meet."""
        counts = [self.holders[u.name] for u in prompt]
        left, right = [0] * len(counts), [0] * len(counts)
        for i in range(1, len(counts)):
            left[i] = counts[i - 1] if counts[i - 1] != counts[i] else left[i - 1]
        for i in range(len(counts) - 2, -1, -1):
            right[i] = counts[i + 1] if counts[i + 1] != counts[i] else right[i + 1]
        return {prompt[i] for i, c in enumerate(counts) if c < left[i] and c < right[i]}

    def arranged(
        self,
        index: int,
        part: list[Unit],
        taken: Callable[[Unit], bool],
        key: Callable[[Unit, int], Key] | None,
    ) -> list[Unit]:
        """`part` of requests[index]'s prompt with the units `taken` moved to the end, where they are
        this request's own, and the rest (in `key` order when given); between two kept units the log
        does not always show together, their seam."""
        kept: list[tuple[Unit, int]] = []  # (unit, tokens taken out right before it)
        gap, copies = 0, collections.Counter[str]()
        for u in part:
            copies[u.name] += 1
            if taken(u):
                gap += u.length
                continue
            kept.append((u, gap, key(u, copies[u.name]) if key else (0, 0)))  # type: ignore[arg-type]
            gap = 0
        if key is not None:
            kept.sort(key=lambda k: k[2])  # type: ignore[index]
        out: list[Unit] = []
        previous = START
        for u, before, _ in kept:  # type: ignore[misc]
            if self.after.get(previous) != {u.name}:
                out.append(Unit(f"j:{previous}>{u.name}", u.start, min(before, self.seam)))
            out.append(u)
            previous = u.name
        return out + [Unit(own(index, u.start), u.start, u.length) for u in part if taken(u)]

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

    logged = _hits(requests, flushes, traffic.rebuilt(lambda index, part: part))
    dynamic = _hits(requests, flushes, traffic.rebuilt(dynamic_last))
    stable = _hits(requests, flushes, traffic.rebuilt(stable_order))
    return Savings(
        [d - h for d, h in zip(dynamic, logged, strict=True)],
        [s - d for s, d in zip(stable, dynamic, strict=True)],
    )
