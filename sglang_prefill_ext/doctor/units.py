"""A fingerprinted prompt as content units, for re-running a log's traffic with its layout changed
(`layout`): the prompt cut at its anchors (`fingerprint`: positions set by the content, so the same
text gives the same cuts wherever it sits), each unit named by the hash of its anchored block, the
part before the first anchor by the grid blocks that cover it.

A unit whose anchored block straddles the end of shared content gets a name of its own, and a
unit's name vouches for its first `block // 2` tokens only: re-runs over units are exact to about a
unit (~`block // 2` tokens) at each place shared content starts or stops."""

from __future__ import annotations

import dataclasses

from sglang_prefill_ext.doctor.log import Request


@dataclasses.dataclass(frozen=True)
class Unit:
    name: str
    start: int
    length: int


def own(index: int, start: int) -> str:
    """A name no other unit has: content seen nowhere else, as far as the fingerprint tells."""
    return f"#{index}:{start}"


def units(index: int, request: Request) -> list[Unit]:
    """requests[index]'s prompt as units covering [0, input_len) in order."""
    fp = request.fp
    assert fp is not None
    end = request.input_len
    cuts = [a for a in fp.anchors if a < end]
    found = [Unit(f"a:{h}", a, b - a) for a, b, h in zip(cuts, [*cuts[1:], end], fp.anchored, strict=False)]
    head = cuts[0] if cuts else end
    if head == 0:
        return found
    covering = -(-head // fp.block)
    name = "g:" + ",".join(fp.blocks[:covering]) if covering <= len(fp.blocks) else own(index, 0)
    return [Unit(name, 0, head), *found]
