"""Test helpers: a paged KV pool with requests scattered over random pages, and fp32 references."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


def scattered_batch(
    heads: tuple[int, int], head_dim: int, prefix: list[int], extend: list[int], block: int, seed: int = 0
):
    """A layout, queries of its new tokens and a shuffled KV pool (a few slots spare) holding every
    context position: (layout, q [N, Hq, D], k_buffer [T, Hkv, D], locs [M])."""
    from sglang_prefill_ext.ops.layout import BlockLayout

    gen = torch.Generator().manual_seed(seed)
    layout = BlockLayout.build(prefix, extend, block)
    q = torch.randn(layout.num_tokens, heads[0], head_dim, generator=gen)
    total = layout.num_context_tokens
    k_buffer = torch.randn(total + 7, heads[1], head_dim, generator=gen)
    locs = torch.randperm(total + 7, generator=gen)[:total]
    return layout, q, k_buffer, locs


@dataclasses.dataclass
class Pool:
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    req_to_token: torch.Tensor  # [B, max_ctx] int32
    req_pool_indices: torch.Tensor  # [B]


def make_pool(
    ctx_lens: list[int],
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    seed: int = 0,
) -> Pool:
    """Requests of `ctx_lens` tokens on pages handed out in a random order (page 0 left unused)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // page_size) for n in ctx_lens]
    num_pages = sum(pages_per_req) + 3
    order = torch.randperm(num_pages - 1, generator=gen) + 1
    req_to_token = torch.zeros(len(ctx_lens) + 2, max(ctx_lens), dtype=torch.int32)
    req_pool_indices = torch.randperm(len(ctx_lens) + 2, generator=gen)[: len(ctx_lens)]
    used = 0
    for b, n in enumerate(ctx_lens):
        pages = order[used : used + pages_per_req[b]]
        used += pages_per_req[b]
        locs = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        req_to_token[req_pool_indices[b], :n] = locs.to(torch.int32)
    shape = (num_pages * page_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return Pool(k.to(device), v.to(device), req_to_token.to(device), req_pool_indices.to(device))


def request_kv(pool: Pool, b: int, ctx_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    locs = pool.req_to_token[pool.req_pool_indices[b], :ctx_len].long()
    return pool.k[locs], pool.v[locs]


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 SDPA of q [n, Hq, D], the last n positions, over k/v [L, Hkv, D], causal, on q's device."""
    n, ctx = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    mask = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(ctx - n, ctx, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1),
        k.float().repeat_interleave(group, 1).transpose(0, 1),
        v.float().repeat_interleave(group, 1).transpose(0, 1),
        attn_mask=mask,
    )
    return out.transpose(0, 1)


def assert_requests_match_sdpa(
    out: torch.Tensor, q: torch.Tensor, pool: Pool, prefix: list[int], extend: list[int]
) -> None:
    """Each request's rows of a batched prefill output equal fp32 SDPA over its own KV (bf16 tolerance)."""
    offset = 0
    for b, (p, n) in enumerate(zip(prefix, extend, strict=True)):
        k, v = request_kv(pool, b, p + n)
        want = sdpa_reference(q[offset : offset + n], k, v)
        torch.testing.assert_close(out[offset : offset + n].float(), want, atol=5e-3, rtol=2e-2)
        offset += n


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 attention of q [n, Hq, D] (the last n positions) over k/v [L, Hkv, D], causal.

    `keep` [n, Hq, L] bool further restricts which keys each query sees.
    """
    n, num_qo_heads, head_dim = q.shape
    ctx = k.shape[0]
    group = num_qo_heads // k.shape[1]
    kk = k.float().repeat_interleave(group, 1)
    vv = v.float().repeat_interleave(group, 1)
    s = torch.einsum("nhd,lhd->hnl", q.float(), kk) / head_dim**0.5
    pos = torch.arange(ctx - n, ctx)
    allowed = torch.arange(ctx)[None, :] <= pos[:, None]
    allowed = allowed[None].expand(num_qo_heads, n, ctx)
    if keep is not None:
        allowed = allowed & keep.permute(1, 0, 2)
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, -1), vv)


def token_keep_mask(
    mask: torch.Tensor, row_block: torch.Tensor, q_pos: torch.Tensor, ctx: int, block_size: int
) -> torch.Tensor:
    """Block-mask rows [Hkv, r, C] of one request -> token-level keep [n, Hkv, ctx] for its queries."""
    q_block = q_pos // block_size
    row_of_token = torch.searchsorted(row_block.long(), q_block.long())
    key_block = torch.arange(ctx) // block_size
    return mask[:, row_of_token][:, :, key_block].permute(1, 0, 2)


def emulate_paged_prefill(
    q_hm: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, indices
) -> torch.Tensor:
    """What FlashInfer's paged prefill computes for plan.PlanIndices (page size 1, causal), in fp32."""
    out = torch.empty(q_hm.shape, dtype=torch.float32)
    qo, kv = indices.qo_indptr.tolist(), indices.kv_indptr.tolist()
    for s in range(indices.num_segments):
        q = q_hm[qo[s] : qo[s + 1]].float()
        idx = indices.kv_indices[kv[s] : kv[s + 1]].long()
        k, v = k_pages.reshape(-1, q.shape[-1])[idx].float(), v_pages.reshape(-1, q.shape[-1])[idx].float()
        n, length = q.shape[0], k.shape[0]
        logits = torch.einsum("ngd,ld->gnl", q, k) / q.shape[-1] ** 0.5
        visible = torch.arange(length)[None, :] <= torch.arange(n)[:, None] + (length - n)
        out[qo[s] : qo[s + 1]] = torch.einsum(
            "gnl,ld->ngd", torch.softmax(logits.masked_fill(~visible, float("-inf")), -1), v
        )
    return out
