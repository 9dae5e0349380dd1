"""Which reused chunk tokens a blended prefill recomputes (docs/BLEND.md, selective recompute).

Tokens outside every chunk span are always computed. Of the chunk tokens, whose KV comes from the
chunk store, a `ratio` is recomputed through the layers, chosen by one of two rules:

- `fixed_ratio`: the first ceil(ratio * n) tokens of each n-token chunk, the tokens that the chunk's
  own start shaped most when it was cached (EPIC's recompute of each chunk's head, arXiv 2410.15332).
- `largest_deviation`: CacheBlend's rule. At an early layer every token is computed; the
  round(ratio * reused) chunk tokens, over all chunks, whose fresh K and V there are farthest (squared
  L2, summed over heads) from the reused K and V are kept for the layers after it.

Both return a bool mask over the prompt's positions: True where the token is computed.
"""

from __future__ import annotations

import math

import torch

from sglang_prefill_ext.blend.spans import Span


def check_ratio(ratio: float) -> None:
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"the recompute ratio must be in [0, 1], got {ratio}")


def chunk_mask(
    spans: tuple[Span, ...], prompt_len: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """[prompt_len] bool: True inside a chunk span (the tokens whose KV is reused)."""
    mask = torch.zeros(prompt_len, dtype=torch.bool, device=device)
    for start, end in spans:
        mask[start:end] = True
    return mask


def fixed_ratio(
    spans: tuple[Span, ...], prompt_len: int, ratio: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """[prompt_len] bool: everything outside the spans and each chunk's first ceil(ratio * n) tokens."""
    check_ratio(ratio)
    computed = ~chunk_mask(spans, prompt_len, device)
    for start, end in spans:
        computed[start : start + math.ceil(ratio * (end - start))] = True
    return computed


def kv_deviation(
    fresh_k: torch.Tensor, fresh_v: torch.Tensor, reused_k: torch.Tensor, reused_v: torch.Tensor
) -> torch.Tensor:
    """[tokens] float32: squared L2 distance of fresh from reused K plus that of V ([tokens, heads, d] each)."""
    dk = (fresh_k.float() - reused_k.float()).square().sum((1, 2))
    dv = (fresh_v.float() - reused_v.float()).square().sum((1, 2))
    return dk + dv


def largest_deviation(spans: tuple[Span, ...], deviation: torch.Tensor, ratio: float) -> torch.Tensor:
    """[prompt_len] bool: everything outside the spans and the round(ratio * reused) chunk tokens of the
    largest `deviation` ([prompt_len], read only inside the spans); ties go to the earlier position."""
    check_ratio(ratio)
    reused = chunk_mask(spans, deviation.shape[0], deviation.device)
    computed = ~reused
    count = round(ratio * int(reused.sum()))
    if count:
        scores = deviation.float().masked_fill(~reused, float("-inf"))
        order = torch.argsort(scores, descending=True, stable=True)
        computed[order[:count]] = True
    return computed
