"""Mass selection: which key blocks each query block keeps, from a scorer's estimated attention mass.

`select_by_mass` keeps, per (head, row block), the fewest largest key blocks holding the row's mass fraction
of the estimate (the antidiagonal and sampled scorers, scorers/; the hybrid scorer adds the pooled rule's
blocks), plus the structural blocks every rule keeps (`structural_blocks`: sinks, the local window with the
diagonal, the prompt's last rows); only causal blocks (c <= the row's own block) are ever kept. The mass
fraction is `settings.mass`, lowered per doubling of the whole prompt (`mass_fraction`): computed once per
request and read by both twins. Heads: the mass's, query heads (the default, `settings.per_query_head`) or
KV heads; output bool [H, R, max_key_blocks].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import triton_enabled
from .layout import BlockLayout
from .settings import SparseSettings


@triton.jit
def is_dense_row(diag, req, num_keys_ptr, ends_prompt_ptr, last_blocks):
    """Whether the row is one of the prompt's last `last_blocks` (only in the extend that ends it)."""
    return (diag >= tl.load(num_keys_ptr + req) - last_blocks) & (tl.load(ends_prompt_ptr + req) != 0)


@triton.jit
def structural_cols(cols, diag, dense_row, sink_blocks, local_blocks):
    """`structural_blocks` for key blocks `cols` of a row (causality is the caller's)."""
    return (cols < sink_blocks) | (cols > diag - local_blocks) | (cols == diag) | dense_row


def _columns_and_diagonals(layout: BlockLayout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Key block indices [1, C] and each row's own (diagonal) block [R, 1]."""
    return torch.arange(layout.max_key_blocks, device=device)[None, :], layout.row_block.long().to(device)[
        :, None
    ]


def structural_blocks(layout: BlockLayout, settings: SparseSettings, device: torch.device) -> torch.Tensor:
    """Blocks kept whatever the scores (sinks, local window, diagonal, the last rows of an extend that ends
    its prompt), and causal: bool [R, C]."""
    cols, diag = _columns_and_diagonals(layout, device)
    req = layout.row_req.long()
    last = layout.req_num_key_blocks[req].long().to(device)[:, None] - settings.last_blocks
    structural = (cols < settings.sink_blocks) | (cols > diag - settings.local_blocks) | (cols == diag)
    structural = structural | ((diag >= last) & layout.req_ends_prompt[req].to(device)[:, None])
    return structural & (cols <= diag)


def mass_fraction(prompt_len: torch.Tensor, settings: SparseSettings) -> torch.Tensor:
    """The mass each prompt's rows hold: `settings.mass`, less `mass_decay` per doubling of the whole prompt
    beyond `mass_len` tokens, at least 0; a mass of 1 (every block) is not lowered (float32, `prompt_len`'s
    shape)."""
    doublings = torch.log2(prompt_len.float() / settings.mass_len).clamp(min=0.0)
    decay = 0.0 if settings.mass >= 1.0 else settings.mass_decay
    return (settings.mass - decay * doublings).clamp(min=0.0)


@triton.jit
def _mass_select_kernel(
    mass_ptr,
    row_req_ptr,
    row_block_ptr,
    num_keys_ptr,
    ends_prompt_ptr,
    fraction_ptr,
    out_ptr,
    num_rows,
    max_cols,
    sink_blocks,
    local_blocks,
    last_blocks,
    BLOCK_C: tl.constexpr,
):
    """One (head, row): the largest blocks holding its request's `fraction` of its mass, found as a
    threshold: the largest value v with sum(mass >= v) >= fraction * sum(mass), bisected over the fp32 bit
    patterns (ordered like the non-negative values they encode; 31 steps end on a value of the row), plus the
    structural blocks."""
    seg = tl.program_id(0)
    row = seg % num_rows
    diag = tl.load(row_block_ptr + row)
    req = tl.load(row_req_ptr + row)
    fraction = tl.load(fraction_ptr + req)
    cols = tl.arange(0, BLOCK_C)
    causal = cols <= diag
    base = seg.to(tl.int64) * max_cols
    x = tl.maximum(tl.load(mass_ptr + base + cols, mask=causal & (cols < max_cols), other=0.0), 0.0)
    goal = fraction * tl.sum(x, 0)
    bits = x.to(tl.int32, bitcast=True)
    hi = tl.max(bits, 0) + 1
    lo = hi * 0
    for _ in range(31):
        mid = lo + (hi - lo) // 2
        held = tl.sum(tl.where(bits >= mid, x, 0.0), 0) >= goal
        lo = tl.where(held, mid, lo)
        hi = tl.where(held, hi, mid)
    keep = (bits >= lo) & (x > tl.where(goal > 0, 0.0, float("inf")))  # nothing to hold: none kept
    dense_row = is_dense_row(diag, req, num_keys_ptr, ends_prompt_ptr, last_blocks)
    structural = structural_cols(cols, diag, dense_row, sink_blocks, local_blocks)
    tl.store(out_ptr + base + cols, ((keep | structural) & causal).to(tl.int8), mask=cols < max_cols)


def select_by_mass_triton(
    mass: torch.Tensor, layout: BlockLayout, settings: SparseSettings, fraction: torch.Tensor
) -> torch.Tensor:
    heads, num_rows, max_cols = mass.shape
    out = torch.empty(heads, num_rows, max_cols, dtype=torch.int8, device=mass.device)
    if out.numel() == 0:
        return out.view(torch.bool)
    block_c = triton.next_power_of_2(max_cols)
    _mass_select_kernel[(heads * num_rows,)](
        mass.contiguous(),
        layout.row_req,
        layout.row_block,
        layout.req_num_key_blocks,
        layout.req_ends_prompt.view(torch.int8),
        fraction.contiguous(),
        out,
        num_rows,
        max_cols,
        settings.sink_blocks,
        settings.local_blocks,
        settings.last_blocks,
        BLOCK_C=block_c,
        num_warps=max(4, min(16, block_c // 256)),
    )
    return out.view(torch.bool)


def select_by_mass_torch(
    mass: torch.Tensor, layout: BlockLayout, settings: SparseSettings, fraction: torch.Tensor
) -> torch.Tensor:
    row_fraction = fraction[layout.row_req.long()].to(mass.device)
    return (
        largest_holding(mass, row_fraction[:, None]) | structural_blocks(layout, settings, mass.device)[None]
    )


def select_by_mass(mass: torch.Tensor, layout: BlockLayout, settings: SparseSettings) -> torch.Tensor:
    """Per (head, row) the fewest key blocks whose estimated mass reaches its request's `mass_fraction`
    (largest first), plus the structural blocks: bool [H, R, C] (H: the mass's heads, KV or query heads).
    `mass` is zero outside causal blocks; a mass of 1 keeps every causal block, at any prompt length. The
    fraction is computed once per request, here, and read by either twin."""
    if settings.mass >= 1.0:
        cols, diag = _columns_and_diagonals(layout, mass.device)
        return (cols <= diag)[None].expand_as(mass).clone()
    fraction = mass_fraction(layout.req_prompt_len, settings)
    impl = select_by_mass_triton if triton_enabled(mass) else select_by_mass_torch
    return impl(mass, layout, settings, fraction)


def largest_holding(mass: torch.Tensor, fraction: float | torch.Tensor) -> torch.Tensor:
    """Along the last dim, the fewest largest positive entries whose sum reaches `fraction` of it (a tensor
    broadcast against `mass` with the last dim kept): bool."""
    ranked, order = mass.sort(-1, descending=True)
    before = ranked.cumsum(-1) - ranked
    keep = (before < fraction * ranked.sum(-1, keepdim=True)) & (ranked > 0)
    return torch.zeros_like(keep).scatter_(-1, order, keep)
