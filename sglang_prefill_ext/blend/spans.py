"""Chunk spans: how a request marks the retrieved chunks of its prompt (docs/BLEND.md).

A `/generate` request with `input_ids` gives `chunk_spans`, a list of `[start, end]` token offsets
into its prompt: half-open, non-empty, in order and disjoint. Each span is one chunk, keyed by its
exact token ids, so the client tokenizes each chunk on its own and concatenates the ids (tokenizing
the joined text could merge tokens across a boundary, and the chunk would never match again).

A malformed value is refused as SGLang refuses a malformed request field: a ValueError, which its
HTTP server answers with status 400 and the message.
"""

from __future__ import annotations

from typing import Any

FIELD = "chunk_spans"
Span = tuple[int, int]


def _is_offset(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_chunk_spans(spans: Any, prompt_len: int) -> tuple[Span, ...]:
    """The chunk spans of a prompt of `prompt_len` tokens (None or []: none); ValueError if malformed."""
    if spans is None:
        return ()
    if not isinstance(spans, list) or not all(
        isinstance(span, list) and len(span) == 2 and all(map(_is_offset, span)) for span in spans
    ):
        raise ValueError(f"{FIELD} must be a list of [start, end] pairs of integer token offsets.")
    parsed: list[Span] = []
    for i, (start, end) in enumerate(spans):
        if not 0 <= start < end <= prompt_len:
            raise ValueError(
                f"{FIELD}[{i}] = [{start}, {end}] is not a non-empty span of the prompt's {prompt_len} "
                f"tokens; valid spans are [start, end) with 0 <= start < end <= {prompt_len}."
            )
        if parsed and start < parsed[-1][1]:
            raise ValueError(
                f"{FIELD}[{i}] = [{start}, {end}] starts before {FIELD}[{i - 1}] ends ({parsed[-1][1]}); "
                "spans must be in order and must not overlap."
            )
        parsed.append((start, end))
    return tuple(parsed)
