"""Exact attention for measuring selections: fp32 block-sparse attention in torch, a chunk of query rows at a
time (never L x L), and the exact block mass an oracle selection ranks by.

What the fp32 emulation of `bench/accuracy/sparse_accuracy.py` runs every layer through (dense ones
too, `keep=None`); `exact_block_mass_triton` is its bf16 oracle's mass, at the cost of two QK^T passes. One
prompt, no cached prefix: query i and key i are both position i, and blocks are `block_size` positions from 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .dispatch import FLOOR

_FLOOR = tl.constexpr(FLOOR)
_LOG2E = 1.4426950408889634


def _causal_scores(
    q: torch.Tensor, k: torch.Tensor, sm_scale: float, keep: torch.Tensor | None, block_size: int, chunk: int
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(start, end, scaled scores [Hkv, G, end - start, end]) of each chunk of query rows over the keys
    it may see (causal, and in a block `keep` [Hkv or Hq, R, C] keeps), -inf elsewhere; fp32."""
    length, num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_qo_heads // num_kv_heads
    keys = k.float().transpose(0, 1)[:, None]  # [Hkv, 1, L, D]
    pos = torch.arange(length, device=q.device)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        rows = q[start:end].float().view(end - start, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        s = torch.matmul(rows * sm_scale, keys[:, :, :end].transpose(-1, -2))  # [Hkv, G, n, end]
        allowed = (pos[None, :end] <= pos[start:end, None])[None]  # [1, n, end]
        if keep is not None:
            allowed = allowed & keep[:, pos[start:end] // block_size][:, :, pos[:end] // block_size]
        outer = min(allowed.shape[0], num_kv_heads)  # 1 (no keep), Hkv or, per query head, Hkv x G
        allowed = allowed.view(outer, allowed.shape[0] // outer, *allowed.shape[1:])
        yield start, end, s.masked_fill(~allowed, float("-inf"))


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    keep: torch.Tensor | None = None,
    block_size: int = 128,
    chunk: int = 1024,
) -> torch.Tensor:
    """Causal attention of q [L, Hq, D] over k, v [L, Hkv, D] restricted to the key blocks `keep`
    [Hkv or Hq, R, C] keeps (None: every causal key): [L, Hq, D] fp32. Peak memory ~ Hq x `chunk` x L
    floats."""
    length, num_qo_heads, head_dim = q.shape
    values = v.float().transpose(0, 1)[:, None]
    out = torch.empty(length, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    for start, end, s in _causal_scores(q, k, sm_scale, keep, block_size, chunk):
        o = torch.matmul(torch.softmax(s, -1), values[:, :, :end])  # [Hkv, G, n, D]
        out[start:end] = o.permute(2, 0, 1, 3).reshape(end - start, num_qo_heads, head_dim)
    return out


def exact_block_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    sm_scale: float,
    block_size: int = 128,
    chunk: int = 1024,
    per_query_head: bool = False,
) -> torch.Tensor:
    """The exact causal attention each (query block, key block) pair holds, summed over the block's
    queries and a KV head's query heads: fp32 [Hkv, R, C] (each row sums to rows x group), or per query
    head ([Hq, R, C], rows summing to rows). What an oracle selection ranks blocks by; `chunk` a multiple
    of `block_size`."""
    length, num_qo_heads, _ = q.shape
    num_blocks = -(-length // block_size)
    heads = num_qo_heads if per_query_head else k.shape[1]
    mass = torch.zeros(heads, num_blocks, num_blocks, dtype=torch.float32, device=q.device)
    for start, end, s in _causal_scores(q, k, sm_scale, None, block_size, chunk):
        p = torch.softmax(s, -1)  # [Hkv, G, n, end]
        p = p.flatten(0, 1) if per_query_head else p.sum(1)
        cols = torch.arange(end, device=q.device) // block_size
        by_key = torch.zeros(*p.shape[:2], num_blocks, device=q.device).index_add_(-1, cols, p)
        rows = torch.arange(start, end, device=q.device) // block_size
        mass.index_add_(1, rows, by_key)
    return mass


def selected_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    choose: Callable[[int, torch.Tensor], torch.Tensor],
    block_size: int = 128,
    chunk: int = 1024,
    per_query_head: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`exact_block_mass`, a selection from it and `block_sparse_attention` over that selection in one pass
    over the scores (the two-pass form computes them twice): per chunk of query rows, `choose(first_row_block,
    mass)` turns the rows' exact block mass [H, r, C] (as `exact_block_mass` sums it) into their kept blocks
    (bool, same shape); the output is their attention renormalized over the kept keys. Returns the output
    [L, Hq, D] fp32 and the selection [H, R, C]; `chunk` a multiple of `block_size`."""
    length, num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_qo_heads // num_kv_heads
    num_blocks = -(-length // block_size)
    padded = num_blocks * block_size
    q, k, v = (F.pad(t, (0, 0, 0, 0, 0, padded - length)) for t in (q, k, v))  # rows past L see nothing real
    keys = k.float().transpose(0, 1)[:, None]  # [Hkv, 1, Lp, D]
    values = v.float().transpose(0, 1)[:, None]
    pos = torch.arange(padded, device=q.device)
    out = torch.empty(length, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    chosen = []
    for start in range(0, padded, chunk):
        end = min(start + chunk, padded)
        rows, cols = (end - start) // block_size, end // block_size
        query = q[start:end].float().view(end - start, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        s = torch.matmul(query * sm_scale, keys[:, :, :end].transpose(-1, -2))  # [Hkv, G, n, end]
        p = torch.softmax(s.masked_fill_(pos[None, :end] > pos[start:end, None], float("-inf")), -1)
        del s
        tiles = p.view(num_kv_heads, group, rows, block_size, cols, block_size)
        valid = (pos[start:end] < length).float().view(1, 1, rows, block_size, 1, 1)
        mass = (tiles * valid).sum((3, 5)) if end > length else tiles.sum((3, 5))  # [Hkv, G, r, c]
        mass = mass.flatten(0, 1) if per_query_head else mass.sum(1)
        keep = choose(start // block_size, F.pad(mass, (0, num_blocks - cols)))
        chosen.append(keep)
        tiles.mul_(keep[..., :cols].reshape(num_kv_heads, -1, rows, 1, cols, 1))
        o = torch.matmul(p, values[:, :, :end]) / p.sum(-1, keepdim=True)  # [Hkv, G, n, D]
        kept = min(end, length) - start
        out[start : start + kept] = o.permute(2, 0, 1, 3).reshape(end - start, num_qo_heads, head_dim)[:kept]
    return out, torch.cat(chosen, 1)


@triton.jit
def _key_block_scores(q, k_ptr, c, length, kv_head, stride_kl, stride_kh, scale_log2, BLOCK: tl.constexpr,
                      HEAD_DIM: tl.constexpr):  # fmt: skip
    """Log2-scaled scores of q's rows against key block `c` of `kv_head`, and the block's key positions."""
    cols = c * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, HEAD_DIM)
    k = tl.load(
        k_ptr + cols[:, None] * stride_kl + kv_head * stride_kh + dims[None, :],
        mask=cols[:, None] < length, other=0.0,
    )  # fmt: skip
    return tl.dot(q, tl.trans(k)) * scale_log2, cols


@triton.jit
def _exact_block_mass_kernel(
    q_ptr, k_ptr, mass_ptr, length, num_blocks, scale_log2, stride_ql, stride_qh, stride_kl, stride_kh,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """One (query block, query head): each row's log-sum-exp over its causal keys (first pass), then the
    attention each causal key block holds, summed over the block's rows (second pass)."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // GROUP
    rows = r * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, HEAD_DIM)
    live = rows < length
    q = tl.load(
        q_ptr + rows[:, None] * stride_ql + h * stride_qh + dims[None, :], mask=live[:, None], other=0.0
    )
    top = tl.full([BLOCK], _FLOOR, tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for c in range(0, r + 1):
        s, cols = _key_block_scores(
            q, k_ptr, c, length, kv_head, stride_kl, stride_kh, scale_log2, BLOCK, HEAD_DIM
        )
        s = tl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
        new_top = tl.maximum(top, tl.max(s, 1))
        total = total * tl.exp2(top - new_top) + tl.sum(tl.exp2(s - new_top[:, None]), 1)
        top = new_top
    lse = top + tl.log2(tl.where(live, total, 1.0))
    for c in range(0, r + 1):
        s, cols = _key_block_scores(
            q, k_ptr, c, length, kv_head, stride_kl, stride_kh, scale_log2, BLOCK, HEAD_DIM
        )
        p = tl.where((cols[None, :] <= rows[:, None]) & live[:, None], tl.exp2(s - lse[:, None]), 0.0)
        tl.store(mass_ptr + (h * num_blocks + r) * num_blocks + c, tl.sum(tl.sum(p, 1), 0))


def exact_block_mass_triton(
    q: torch.Tensor, k: torch.Tensor, sm_scale: float, block_size: int = 128, per_query_head: bool = False
) -> torch.Tensor:
    """`exact_block_mass` (its twin, held equal by the tests) in one Triton program per query block and query
    head, in q's dtype with fp32 accumulation: two QK^T passes, nothing L x L in memory."""
    q, k = q.contiguous(), k.contiguous()  # the kernel reads head_dim at unit stride
    length, num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    num_blocks = -(-length // block_size)
    mass = torch.zeros(num_qo_heads, num_blocks, num_blocks, dtype=torch.float32, device=q.device)
    _exact_block_mass_kernel[(num_blocks, num_qo_heads)](
        q, k, mass, length, num_blocks, sm_scale * _LOG2E, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        GROUP=num_qo_heads // num_kv_heads, BLOCK=block_size, HEAD_DIM=head_dim, num_warps=8,
    )  # fmt: skip
    return mass if per_query_head else mass.view(num_kv_heads, -1, num_blocks, num_blocks).sum(1)
