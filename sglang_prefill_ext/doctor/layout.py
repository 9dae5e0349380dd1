"""What a layout fix saves, by re-running one log's own traffic with the fix applied: the same prompts,
in the same order and timing (`timeline`), against an unbounded prefix cache of content units
(`units`), once as logged and once per fix; a request's saving is its cache hit with the fix less its
hit with the fix before it.

A prompt is re-run as pieces of shared content (units held by requests of other conversations) and
what lies between them (units no other conversation holds, and valleys: units where two pieces meet,
held by fewer requests than the pieces on both sides). The tokens from a piece's last anchor to the
next piece's first anchor are its tail and the next one's head (`seams`): a fix that brings two
pieces together joins them with the fitted tail and head, and what lay between them goes to the end.

The fixes:
- `dynamic`: what differs per request (units no other conversation holds) moved to the end;
- `changed_prefix`, on top of `dynamic`: the part of a prompt that changed (each `Change`, in every
  prompt holding the content around it at the same offsets: its old and its new text) moved after
  the shared content, its text kept (later prompts with the same text still reuse it);
- `reordered`, on top of `dynamic`: the shared content in one stable order, the order it was first
  seen in; what lies between pieces goes to the end.

What is left to compute once the layout is fixed (`reordered`), but was seen before at any position,
is non-prefix reuse: no layout recovers it. A conversation's next turn keeps its previous prompt in
front, fixed as that turn was: only what the turn appends is laid out anew (`threads`)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from sglang_prefill_ext.doctor import threads, timeline
from sglang_prefill_ext.doctor.log import Request
from sglang_prefill_ext.doctor.seams import END, START, Join, Seams
from sglang_prefill_ext.doctor.units import Unit, own, units

FIXES = ("dynamic", "changed_prefix", "reordered")
# what a fix does with a unit it moves to the end: its text becomes this request's own, or is kept
OWN, KEPT = "own", "kept"

Key = tuple[int, int]  # (request, offset) where a unit was first seen
Taken = Callable[[int, Unit], str | None]  # (position in the part, unit): OWN, KEPT or None (stays)


@dataclasses.dataclass(frozen=True)
class Part:
    """What a prompt appends to its previous turn (all of it, for a first turn), as units."""

    start: int
    end: int
    units: list[Unit]


@dataclasses.dataclass(frozen=True)
class Change:
    """A prompt that changed: requests[index] diverges at `diverges` from the prompt it changed, and
    the content after the change resumes at `resumes`, at its offset in both."""

    index: int
    diverges: int
    resumes: int


@dataclasses.dataclass(frozen=True)
class _Stretch:
    """From the anchor of a part's piece unit (or the part's start) to the next one's (or its end)."""

    left: str
    right: str
    tokens: int
    inside: tuple[str, ...]  # the names of the units between
    offsets: frozenset[int]  # their offsets from the first anchor

    @classmethod
    def of(cls, part: Part, p: int, q: int) -> _Stretch:
        """Between units p and q of the part (-1: its start, len(units): its end)."""
        lo = part.start if p < 0 else part.units[p].start
        hi = part.end if q >= len(part.units) else part.units[q].start
        between = part.units[p + 1 : q] if p < q else []
        return cls(
            START if p < 0 else part.units[p].name,
            END if q >= len(part.units) else part.units[q].name,
            hi - lo,
            tuple(u.name for u in between),
            frozenset(u.start - lo for u in between),
        )

    @property
    def identity(self) -> tuple[str, str, str, int]:
        return self.left, "|".join(self.inside), self.right, self.tokens


def _cut(prompt: list[Unit], request: Request, cuts: dict[tuple[int, str], int]) -> list[Unit]:
    """The prompt's units, each cut where a prompt holding the same grid block diverged inside it
    beyond what its anchored block vouches for: content no anchor shows, that the grid does."""
    fp = request.fp
    assert fp is not None
    at = {cuts[(i, h)] for i, h in enumerate(fp.blocks) if (i, h) in cuts}
    out = []
    for u in prompt:
        inside = sorted(d for d in at if u.start < d < u.start + u.length)
        for lo, hi in zip([u.start, *inside], [*inside, u.start + u.length], strict=True):
            name = u.name if lo == u.start else f"c:{fp.blocks[lo // fp.block]}:{lo}"
            out.append(Unit(name, lo, hi - lo))
    return out


class _Traffic:
    """One log's prompts as units and pieces, and what the fixes need to know of them."""

    def __init__(
        self, requests: Sequence[Request], parent: list[int | None], cuts: dict[tuple[int, str], int]
    ) -> None:
        self.requests = requests
        self.parent = parent
        self.half = requests[0].fp.block // 2 if requests else 0  # type: ignore[union-attr]
        self.prompts = [_cut(units(index, r), r, cuts) for index, r in enumerate(requests)]
        held: dict[str, list[int]] = collections.defaultdict(list)
        self.after: dict[str, set[str]] = collections.defaultdict(set)
        self.before: dict[str, set[str]] = collections.defaultdict(set)
        first: dict[tuple[str, int], Key] = {}
        self.first: list[dict[int, Key]] = []  # per prompt, by offset: where its unit was first seen
        self.at: list[set[tuple[str, int]]] = []  # per prompt: its units' (name, offset)
        for index, prompt in enumerate(self.prompts):
            copies: collections.Counter[str] = collections.Counter()
            for u, following in zip(prompt, prompt[1:], strict=False):
                self.after[u.name].add(following.name)
                self.before[following.name].add(u.name)
            keys: dict[int, Key] = {}
            for u in prompt:
                if not held[u.name] or held[u.name][-1] != index:
                    held[u.name].append(index)
                copies[u.name] += 1  # a repeat within a prompt keeps its place after the copies before it
                keys[u.start] = first.setdefault((u.name, copies[u.name]), (index, u.start))
            self.first.append(keys)
            self.at.append({(u.name, u.start) for u in prompt})
        self.held = {name: frozenset(held_by) for name, held_by in held.items()}
        self.shared = {name for name, held_by in held.items() if self._shared(held_by)}
        self.parts = [self._part(index) for index in range(len(requests))]
        self.loose = [self._loose(part.units) for part in self.parts]
        stretches = [(index, st) for index in range(len(requests)) for st in self._stretches(index)]
        # the offsets from a piece's last anchor at which every prompt holding it has an anchor: its own
        # content's, whose anchored block reaches past its end
        after_end: dict[str, set[int]] = {}
        showing: dict[tuple, list[int]] = collections.defaultdict(list)
        for index, st in stretches:
            if st.left != START:
                after_end[st.left] = after_end.get(st.left, st.offsets) & st.offsets
            showing[st.identity].append(index)
        self.shared_middles = {identity for identity, held_by in showing.items() if self._shared(held_by)}
        self.seams = Seams(
            [
                Join(
                    st.left,
                    st.right,
                    st.tokens,
                    st.left != START and st.right != END and st.offsets <= after_end[st.left],
                )
                for _, st in stretches
            ],
            2 * self.half,
        )

    def _shared(self, held_by: Sequence[int]) -> bool:
        """Whether two of these requests (in start order) are of different conversations."""
        return any(not threads.related(self.parent, a, b) for a, b in zip(held_by, held_by[1:], strict=False))

    def _part(self, index: int) -> Part:
        prompt, end, p = self.prompts[index], self.requests[index].input_len, self.parent[index]
        if p is None:
            return Part(0, end, prompt)
        cut = self.requests[p].input_len
        appended = [u for u in prompt if u.start >= cut]
        straddling = [u for u in prompt if u.start < cut < u.start + u.length]
        if straddling:  # the rest of a unit that began in the previous turn: new content
            u = straddling[0]
            appended.insert(0, Unit(own(index, cut), cut, u.start + u.length - cut))
        return Part(cut, end, appended)

    def _loose(self, part: list[Unit]) -> set[int]:
        """The positions of the units that are no piece of shared content: held by no other
        conversation, or a valley (held only by requests that hold the nearest differently held unit
        on either side, and by fewer: an anchored block straddling where two pieces meet)."""
        held = [self.held.get(u.name, frozenset()) for u in part]
        left: list[frozenset[int] | None] = [None] * len(held)
        right: list[frozenset[int] | None] = [None] * len(held)
        for i in range(1, len(held)):
            left[i] = held[i - 1] if held[i - 1] != held[i] else left[i - 1]
        for i in range(len(held) - 2, -1, -1):
            right[i] = held[i + 1] if held[i + 1] != held[i] else right[i + 1]
        return {
            i
            for i, (u, h, lo, hi) in enumerate(zip(part, held, left, right, strict=True))
            if u.name not in self.shared or (lo is not None and hi is not None and h < lo and h < hi)
        }

    def interior(self, left: str, right: str) -> bool:
        """Whether `right` always follows `left` and `left` always precedes it: one piece."""
        return self.after[left] == {right} and self.before[right] == {left}

    def _stretches(self, index: int) -> list[_Stretch]:
        """Where requests[index]'s part shows two pieces one after the other (or a piece at its start
        or end), but for two units of one piece."""
        part, loose = self.parts[index], self.loose[index]
        pieces = [i for i in range(len(part.units)) if i not in loose]
        found = []
        for p, q in zip([-1, *pieces], [*pieces, len(part.units)], strict=True):
            stretch = _Stretch.of(part, p, q)
            if not self.interior(stretch.left, stretch.right):
                found.append(stretch)
        return found

    def arranged(
        self, index: int, taken: Taken, key: Callable[[Unit], Key] | None = None, own_middles: bool = False
    ) -> list[Unit]:
        """requests[index]'s part with the units `taken` moved to the end (their text kept, or this
        request's own), the other pieces in `key` order when given; with `own_middles`, what lies
        between two pieces where no other conversation shows the same goes to the end too. Two pieces
        the log shows apart, or with what was between them moved, are joined by their fitted tail and
        head."""
        part, loose = self.parts[index], self.loose[index]
        moves = [taken(i, u) for i, u in enumerate(part.units)]
        pieces = [i for i in range(len(part.units)) if i not in loose and moves[i] is None]
        order = sorted(pieces, key=lambda i: key(part.units[i])) if key is not None else pieces
        edge = len(part.units)  # positions: -1 the part's start, `edge` its end
        logged = set(zip([-1, *pieces], [*pieces, edge], strict=True))
        out: list[Unit] = []
        kept = 0  # the tokens of the text moved with its units kept
        for p, q in zip([-1, *order], [*order, edge], strict=True):
            stretch = _Stretch.of(part, p, q)
            left, right = stretch.left, stretch.right
            if self.interior(left, right):
                out.append(Unit(left, part.units[p].start, stretch.tokens))
                continue
            tail, head, middle = self.seams.tail(left), self.seams.head(right), None
            if (p, q) in logged:  # the stretch between them as logged
                tail = min(tail, stretch.tokens)
                head = min(head, stretch.tokens - tail)
                middle = stretch.tokens - tail - head
                if KEPT in moves[p + 1 : q]:
                    kept, middle = kept + middle, None
                elif any(moves[p + 1 : q]) or (own_middles and stretch.identity not in self.shared_middles):
                    middle = None
            if p >= 0:
                out.append(Unit(left, part.units[p].start, tail))
            if middle or (middle is not None and stretch.offsets):  # what lies between, named as logged
                out.append(Unit("x:" + ",".join(map(str, stretch.identity)), -1, middle))
            if q < edge:
                out.append(Unit(f"h:{right}", part.units[q].start, head))
        if kept > 0:  # the changed text, after the shared content
            names = ",".join(u.name for u, move in zip(part.units, moves, strict=True) if move == KEPT)
            out.append(Unit("m:" + names, -1, kept))
        moved = part.end - part.start - sum(u.length for u in out)
        return [*out, Unit(own(index, part.start), part.start, moved)] if moved > 0 else out

    def rebuilt(self, arrange: Callable[[int], list[Unit]]) -> list[list[Unit]]:
        """Each prompt as `arrange(index)` lays out its part, behind its previous turn as rebuilt."""
        rebuilt: list[list[Unit]] = []
        for index, p in enumerate(self.parent):
            rebuilt.append((rebuilt[p] if p is not None else []) + arrange(index))
        return rebuilt


def _rerun(
    requests: Sequence[Request], flushes: Sequence[float], prompts: list[list[Unit]]
) -> tuple[list[int], list[int]]:
    """Each request's prefix-cache hit (tokens) with these prompts, in the log's order and timing, and
    the tokens after its hit that a prompt in the cache held at any position."""
    root: dict = {}
    seen: set[str] = set()
    hits, elsewhere = [0] * len(prompts), [0] * len(prompts)
    for event, index in timeline.events(requests, flushes):
        if event == "flush":
            root, seen = {}, set()
        elif event == "cache":
            node = root
            for u in prompts[index]:
                node = node.setdefault(u.name, {})
                seen.add(u.name)
        else:
            node, prompt, matched = root, prompts[index], 0
            while matched < len(prompt) and prompt[matched].name in node:
                node = node[prompt[matched].name]
                matched += 1
            hits[index] = sum(u.length for u in prompt[:matched])
            elsewhere[index] = sum(u.length for u in prompt[matched:] if u.name in seen)
    return hits, elsewhere


class Reruns:
    """One log's traffic re-run as logged and with each fix (every request fingerprinted, in start
    order; `parent`: `threads.parents`; `diverges`: where each prompt stops sharing a prefix with the
    cache, as the server and the grid saw it). Per request: `dynamic` and `reordered`, the tokens each
    fix adds to its hit (negative: loses), and `non_prefix`, what the fixed layout leaves to compute
    that the cache held elsewhere; `changed` re-runs the changes the diagnosis found.

    Where the re-run as logged gives a prompt a longer hit than its grid blocks allow (it diverged
    where no anchor shows it), its units are cut there, in every prompt holding that grid block, and
    the traffic is read again."""

    def __init__(
        self,
        requests: Sequence[Request],
        flushes: Sequence[float],
        parent: list[int | None],
        diverges: Sequence[int],
    ) -> None:
        self.requests, self.flushes = requests, flushes
        self.traffic = _Traffic(requests, parent, {})
        block = 2 * self.traffic.half
        logged, _ = self._run(lambda index, i, u: None)
        cuts = {
            (d // block, r.fp.blocks[d // block]): d  # type: ignore[union-attr]
            for r, d, hit in zip(requests, diverges, logged, strict=True)
            if hit >= (d // block + 1) * block and d // block < len(r.fp.blocks)  # type: ignore[union-attr]
        }
        if cuts:
            self.traffic = _Traffic(requests, parent, cuts)
            logged, _ = self._run(lambda index, i, u: None)
        traffic = self.traffic
        self.dynamic_hits, _ = self._run(self._dynamic, own_middles=True)
        stable, self.non_prefix = self._run(
            lambda index, i, u: OWN if i in traffic.loose[index] else None,
            lambda index, u: traffic.first[index][u.start],
            own_middles=True,
        )
        self.dynamic = [d - h for d, h in zip(self.dynamic_hits, logged, strict=True)]
        self.reordered = [s - d for s, d in zip(stable, self.dynamic_hits, strict=True)]

    def _dynamic(self, index: int, i: int, u: Unit) -> str | None:
        return OWN if u.name not in self.traffic.shared else None

    def _run(
        self,
        taken: Callable[[int, int, Unit], str | None],
        key: Callable[[int, Unit], Key] | None = None,
        own_middles: bool = False,
    ) -> tuple[list[int], list[int]]:
        def arrange(index: int) -> list[Unit]:
            return self.traffic.arranged(
                index,
                lambda i, u: taken(index, i, u),
                None if key is None else lambda u: key(index, u),
                own_middles,
            )

        return _rerun(self.requests, self.flushes, self.traffic.rebuilt(arrange))

    def changed(self, changes: Sequence[Change]) -> tuple[list[int], list[int]]:
        """Per request, the tokens moving each change after the shared content adds to its hit, on top
        of `dynamic`, and what that layout leaves to compute that the cache held elsewhere. A change applies to every prompt holding the same grid blocks before it and the
        unit it resumes at, at the same offset: its text there (the units whose anchored block reaches
        past the divergence, up to the resumption) goes to the end."""
        traffic, half = self.traffic, self.traffic.half
        spans: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
        for change in changes:
            resume = next((u for u in traffic.prompts[change.index] if u.start >= change.resumes), None)
            if resume is None:
                continue
            prefix = self.requests[change.index].fp.blocks[: change.diverges // (2 * half)]  # type: ignore[union-attr]
            for index, request in enumerate(self.requests):
                if (
                    request.fp.blocks[: len(prefix)] == prefix
                    and (resume.name, resume.start) in traffic.at[index]
                ):  # type: ignore[union-attr]
                    spans[index].append((change.diverges, resume.start))

        def taken(index: int, i: int, u: Unit) -> str | None:
            if any(u.start < resumes and u.start + half > diverges for diverges, resumes in spans[index]):
                return KEPT
            return self._dynamic(index, i, u)

        hits, elsewhere = self._run(taken, own_middles=True)
        return [c - d for c, d in zip(hits, self.dynamic_hits, strict=True)], elsewhere
