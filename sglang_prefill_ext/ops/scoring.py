"""Block selection: which key blocks each query block keeps, per query head (the default) or per KV head.

`select_by_mass` keeps the blocks that carry a row's estimated attention mass (the sampled and antidiagonal
scorers, sampled.py and antidiagonal.py; the hybrid scorer keeps the union of it and the pooled rule). The pooled scorer reads one
mean key per block (pooled from the KV cache): the score of query block r and key block c for query
head g is s = sm_scale * mean(q_r) . mean(k_c), exactly the mean logit over the block pair. For KV
head h the block is kept when any query head of h's group has s >= max_c'(s) + log(threshold) (the
estimated attention weight is at least `threshold` of the row's best), or a structural rule holds
(sink, local window incl. the diagonal, the prompt's last rows); only causal blocks (c <= the row's own block) are
ever kept. Output: bool [Hkv, R, max_key_blocks]; with `settings.per_query_head` each query head keeps
the blocks its own score passes, [Hq, R, max_key_blocks].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import FLOOR, triton_enabled
from .layout import BlockLayout
from .settings import SparseSettings


@triton.jit
def _scores(q, kpool_ptr, key_offset, cols, num_cols, num_kv_heads, head, HEAD_DIM: tl.constexpr):
    """Scaled pooled scores [GROUP_PAD, BLOCK_C] of the row's query heads against key blocks `cols`."""
    c_live = cols < num_cols
    dims = tl.arange(0, HEAD_DIM)
    k_rows = (key_offset + cols) * num_kv_heads + head
    k = tl.load(kpool_ptr + k_rows[:, None] * HEAD_DIM + dims[None, :], mask=c_live[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="tf32x3")
    return tl.where(c_live[None, :], s, float("-inf"))


@triton.jit
def _dense_row(diag, req, num_keys_ptr, ends_prompt_ptr, last_blocks):
    """Whether the row is one of the prompt's last `last_blocks` (only in the extend that ends it)."""
    return (diag >= tl.load(num_keys_ptr + req) - last_blocks) & (tl.load(ends_prompt_ptr + req) != 0)


@triton.jit
def _structural(cols, diag, dense_row, sink_blocks, local_blocks):
    """`structural_blocks` for key blocks `cols` of a row (causality is the caller's)."""
    return (cols < sink_blocks) | (cols > diag - local_blocks) | (cols == diag) | dense_row


@triton.jit
def _select_kernel(
    qpool_ptr,
    kpool_ptr,
    row_req_ptr,
    row_block_ptr,
    key_offset_ptr,
    num_keys_ptr,
    ends_prompt_ptr,
    out_ptr,
    num_rows,
    max_cols,
    num_qo_heads,
    num_kv_heads,
    group,
    sm_scale,
    log_threshold,
    sink_blocks,
    local_blocks,
    last_blocks,
    HEAD_DIM: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PER_QUERY_HEAD: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.load(row_req_ptr + row)
    diag = tl.load(row_block_ptr + row)
    key_offset = tl.load(key_offset_ptr + req).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    g = tl.arange(0, GROUP_PAD)
    g_live = g < group
    q_rows = row.to(tl.int64) * num_qo_heads + head * group + g
    q = tl.load(qpool_ptr + q_rows[:, None] * HEAD_DIM + dims[None, :], mask=g_live[:, None], other=0.0)
    q = q * sm_scale
    num_cols = diag + 1
    best = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    for c0 in range(0, num_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        s = _scores(q, kpool_ptr, key_offset, cols, num_cols, num_kv_heads, head, HEAD_DIM)
        best = tl.maximum(best, tl.max(s, axis=1))
    dense_row = _dense_row(diag, req, num_keys_ptr, ends_prompt_ptr, last_blocks)
    out_row = out_ptr + (head.to(tl.int64) * num_rows + row) * max_cols
    q_out_rows = out_ptr + ((head * group + g).to(tl.int64) * num_rows + row) * max_cols
    for c0 in range(0, num_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        c_live = cols < num_cols
        s = _scores(q, kpool_ptr, key_offset, cols, num_cols, num_kv_heads, head, HEAD_DIM)
        passed = ((s - best[:, None]) >= log_threshold) & g_live[:, None]
        structural = _structural(cols, diag, dense_row, sink_blocks, local_blocks)
        if PER_QUERY_HEAD:
            keep = passed | structural[None, :]
            live = g_live[:, None] & c_live[None, :]
            tl.store(q_out_rows[:, None] + cols[None, :], (keep & live).to(tl.int8), mask=live)
        else:
            keep = (tl.max(passed.to(tl.int32), axis=0) > 0) | structural
            tl.store(out_row + cols, (keep & c_live).to(tl.int8), mask=c_live)


def select_blocks_triton(
    qpool: torch.Tensor,
    kpool: torch.Tensor,
    layout: BlockLayout,
    settings: SparseSettings,
    sm_scale: float,
    block_cols: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """`block_cols` key blocks per inner step (launch tuning only)."""
    num_rows, num_qo_heads, head_dim = qpool.shape
    num_kv_heads = kpool.shape[1]
    group = num_qo_heads // num_kv_heads
    heads = num_qo_heads if settings.per_query_head else num_kv_heads
    out = torch.zeros(heads, num_rows, layout.max_key_blocks, dtype=torch.int8, device=qpool.device)
    if num_rows == 0:
        return out.view(torch.bool)
    _select_kernel[(num_rows, num_kv_heads)](
        qpool.contiguous(),
        kpool.contiguous(),
        layout.row_req,
        layout.row_block,
        layout.req_key_offset,
        layout.req_num_key_blocks,
        layout.req_ends_prompt.view(torch.int8),
        out,
        num_rows,
        layout.max_key_blocks,
        num_qo_heads,
        num_kv_heads,
        group,
        sm_scale,
        max(settings.log_threshold, FLOOR),
        settings.sink_blocks,
        settings.local_blocks,
        settings.last_blocks,
        HEAD_DIM=head_dim,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_C=block_cols,
        PER_QUERY_HEAD=settings.per_query_head,
        num_warps=num_warps,
    )
    return out.view(torch.bool)


def block_scores_torch(
    qpool: torch.Tensor, kpool: torch.Tensor, layout: BlockLayout, sm_scale: float
) -> torch.Tensor:
    """Pooled scores s [Hq, R, max_key_blocks], -inf outside each row's causal blocks."""
    num_rows, num_qo_heads, _ = qpool.shape
    num_kv_heads = kpool.shape[1]
    group = num_qo_heads // num_kv_heads
    cols = torch.arange(layout.max_key_blocks, device=qpool.device)
    idx = (layout.row_key_offset.long()[:, None] + cols).clamp(max=kpool.shape[0] - 1)
    k = kpool[idx].repeat_interleave(group, dim=2)  # [R, C, Hq, D]
    s = torch.einsum("rhd,rchd->hrc", qpool.float() * sm_scale, k.float())
    causal = cols[None, :] <= layout.row_block.long()[:, None]
    return s.masked_fill(~causal, float("-inf"))


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


def select_blocks_torch(
    qpool: torch.Tensor, kpool: torch.Tensor, layout: BlockLayout, settings: SparseSettings, sm_scale: float
) -> torch.Tensor:
    num_kv_heads = kpool.shape[1]
    s = block_scores_torch(qpool, kpool, layout, sm_scale)
    num_qo_heads, num_rows, num_cols = s.shape
    causal = torch.isfinite(s[0])
    best = s.amax(-1, keepdim=True)
    passed = (s - best) >= settings.log_threshold
    if not settings.per_query_head:
        passed = passed.view(num_kv_heads, -1, num_rows, num_cols).any(1)
    return (passed & causal[None]) | structural_blocks(layout, settings, s.device)[None]


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
    dense_row = _dense_row(diag, req, num_keys_ptr, ends_prompt_ptr, last_blocks)
    structural = _structural(cols, diag, dense_row, sink_blocks, local_blocks)
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


def select_blocks(
    qpool: torch.Tensor, kpool: torch.Tensor, layout: BlockLayout, settings: SparseSettings, sm_scale: float
) -> torch.Tensor:
    """Kept blocks, bool [Hkv, R, max_key_blocks] (see the module's docstring)."""
    impl = select_blocks_triton if triton_enabled(qpool) else select_blocks_torch
    return impl(qpool, kpool, layout, settings, sm_scale)
