"""Re-positioning cached keys: K rotated for positions p becomes K rotated for positions q.

RoPE composes: R(q) = R(q) R(p)^T R(p), so a reused chunk's keys move to new positions without the
model. The rotation applied is R(theta_q) R(theta_p)^T with theta_x = float32(x * inv_freq), the very
angles of the model's float32 cos/sin table, composed by the angle-difference identities rather than
as one rotation by float32((q - p) * inv_freq): near position 1e5 an angle's float32 ulp is ~0.01 rad,
an error the cached key does not carry (its angle is theta_p exactly). A rotation keeps each pair's
norm, so YaRN's attention factor stays as it was cached (ops/rope.py).

`rerotate_triton` and `rerotate_torch` are twins (ops/dispatch.py); both compute in float32 and
return `k`'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_prefill_ext.ops.dispatch import triton_enabled
from sglang_prefill_ext.ops.rope import Rope


def _check(k: torch.Tensor, from_pos: torch.Tensor, to_pos: torch.Tensor, rope: Rope) -> None:
    if k.dim() != 3 or k.shape[-1] != rope.head_dim:
        raise ValueError(f"k must be [tokens, heads, {rope.head_dim}], got {list(k.shape)}")
    if from_pos.shape != (k.shape[0],) or to_pos.shape != (k.shape[0],):
        raise ValueError(
            f"positions must be [{k.shape[0]}], got {list(from_pos.shape)}, {list(to_pos.shape)}"
        )


@triton.jit
def _rerotate_kernel(
    k_ptr,
    out_ptr,
    from_ptr,
    to_ptr,
    freq_ptr,
    num_tokens,
    stride_n,
    stride_h,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    head = tl.program_id(1)
    i = tl.arange(0, HALF_PAD)
    live = n < num_tokens
    mask = live[:, None] & (i < HALF)[None, :]
    freq = tl.load(freq_ptr + i, mask=i < HALF, other=0.0)
    theta_p = tl.load(from_ptr + n, mask=live, other=0).to(tl.float32)[:, None] * freq[None, :]
    theta_q = tl.load(to_ptr + n, mask=live, other=0).to(tl.float32)[:, None] * freq[None, :]
    cos_p, sin_p = tl.cos(theta_p), tl.sin(theta_p)
    cos_q, sin_q = tl.cos(theta_q), tl.sin(theta_q)
    cos = cos_q * cos_p + sin_q * sin_p
    sin = sin_q * cos_p - cos_q * sin_p
    src = k_ptr + n.to(tl.int64)[:, None] * stride_n + head * stride_h + i[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + (n.to(tl.int64)[:, None] * tl.num_programs(1) + head) * (2 * HALF) + i[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def rerotate_triton(
    k: torch.Tensor, from_pos: torch.Tensor, to_pos: torch.Tensor, rope: Rope
) -> torch.Tensor:
    _check(k, from_pos, to_pos, rope)
    if k.stride(-1) != 1:
        k = k.contiguous()
    tokens, heads, dim = k.shape
    out = torch.empty(tokens, heads, dim, dtype=k.dtype, device=k.device)
    if tokens == 0:
        return out
    block_n = 16
    _rerotate_kernel[(triton.cdiv(tokens, block_n), heads)](
        k,
        out,
        from_pos,
        to_pos,
        rope.inv_freq(k.device),
        tokens,
        k.stride(0),
        k.stride(1),
        HALF=dim // 2,
        HALF_PAD=triton.next_power_of_2(dim // 2),
        BLOCK_N=block_n,
    )
    return out


def rerotate_torch(k: torch.Tensor, from_pos: torch.Tensor, to_pos: torch.Tensor, rope: Rope) -> torch.Tensor:
    _check(k, from_pos, to_pos, rope)
    freq = rope.inv_freq(k.device)
    theta_p = (from_pos.to(torch.float32)[:, None] * freq)[:, None, :]
    theta_q = (to_pos.to(torch.float32)[:, None] * freq)[:, None, :]
    cos = theta_q.cos() * theta_p.cos() + theta_q.sin() * theta_p.sin()
    sin = theta_q.sin() * theta_p.cos() - theta_q.cos() * theta_p.sin()
    x1, x2 = k.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(k.dtype)


def rerotate(k: torch.Tensor, from_pos: torch.Tensor, to_pos: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Keys `k` [tokens, heads, head_dim] cached after `rope` at positions `from_pos` [tokens], as
    the model would have cached them at `to_pos` [tokens]; a new tensor of k's dtype."""
    impl = rerotate_triton if triton_enabled(k) else rerotate_torch
    return impl(k, from_pos, to_pos, rope)
