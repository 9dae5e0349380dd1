"""Chunk plans: where a chunked request's chunk ends, and how many prefill tokens a pass may take.

Aligned chunk ends: SGLang cuts a long prompt where the pass's token budget runs out. The chunk is
inserted into the tree as it lands (`cache_unfinished_req`), so it becomes a node ending wherever
the budget happened to end. Here the end is moved back to a page boundary and, when another
waiting request's prompt stops sharing this one's in the chunk's last part, to that divergence
point: the landed chunk is then exactly the node the other request matches (no split of a fresh
node, and its match ends at a node boundary the next chunk never touches).

Decode-adaptive budget: a prefill pass stalls every running decode request for its duration, so
with many requests decoding the chunk shrinks in proportion (total stall, decode requests x chunk
tokens, stays at what `reference` decode requests would see with the full chunk).
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable, Iterator

from sglang_prefill_ext.radix.tokens import common_prefix_len
from sglang_prefill_ext.runner.inflight import Position


def divergence_points(
    ours: Position, end: int, others: Iterable[Position], shared_anchors: Container[Hashable]
) -> Iterator[int]:
    """Where each of `others` stops sharing `ours.tokens[:end]`, for those whose match ends on our
    matched path (`shared_anchors`: the nodes of that path, the root included), so they share
    `ours.tokens[:other.start]`."""
    stored = ours.tokens[:end].tobytes()
    for other in others:
        if other.namespace != ours.namespace or other.anchor not in shared_anchors:
            continue
        limit = min(end, len(other.tokens)) - other.start
        if limit > 0:
            yield other.start + common_prefix_len(stored, other.start, other.tokens[other.start :], limit)


def aligned_chunk_end(start: int, end: int, page_size: int, divergences: Iterable[int], tail: float) -> int:
    """The end of a chunk SGLang planned as [start, end), `end` short of the prompt's end.

    Page-aligned down, then pulled back to the latest page-aligned divergence point in the last
    `tail` fraction of the chunk; at least one page past `start` (else SGLang's own `end`)."""
    aligned = end // page_size * page_size
    if aligned - start < page_size:
        return end
    cut = aligned - int(tail * (aligned - start))
    points = [d // page_size * page_size for d in divergences if cut <= d < aligned]
    best = max((p for p in points if p - start >= page_size), default=aligned)
    return best


def decode_adaptive_budget(base: int, decoding: int, reference: int, min_tokens: int, page_size: int) -> int:
    """The pass's chunked-prefill budget: `base` up to `reference` decoding requests (0: always),
    then `base * reference / decoding`, page-aligned, never below `min_tokens` (nor one page)."""
    if reference <= 0 or decoding <= reference or base <= 0:
        return base
    budget = max(base * reference // decoding, min_tokens, page_size)
    return min(budget, base) // page_size * page_size
