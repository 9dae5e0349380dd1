"""Block-sparse prefill attention as one Triton kernel that reads the kept-block mask itself.

No host step at all: `plan` turns the mask [Hm, R, C] into each (mask head, row)'s kept off-diagonal
key blocks, in increasing order, as the first entries of their context-list starts (a cumsum and a
scatter on the device); `run` launches one program per (row block, query head). A program reads its
query block in place from q [N, Hq, D], walks its kept blocks, gathers each block's keys and values
from the KV pool [T, Hkv, D] through the context's slots, keeps FlashAttention's running max and sum,
then attends its diagonal block under the causal mask (the diagonal is always attended, whatever the
mask says; a request's last key block, the only partial one, is some row's diagonal) and writes its
rows of o [N, Hq, D]. A mask per KV head (Hm = Hkv) serves the KV head's query heads from one list,
a mask per query head (Hm = Hq) gives each its own: nothing is packed or expanded per head, so the
FlashInfer path's token-index expansion, host read-back and planner call (plan.py, attention.py)
have no counterpart here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import BlockLayout

LOG2E = 1.4426950408889634
# Keys per inner step, warps, pipeline stages (H200, head_dim 128, see bench/results).
BLOCK_N, NUM_WARPS, NUM_STAGES = 64, 8, 3


@triton.jit
def _softcap_scores(s, soft_cap, scale_log2, SOFT_CAP: tl.constexpr):
    """Logits in log2 units: s * sm_scale * log2(e), or soft_cap * tanh(s * sm_scale / soft_cap) first."""
    if SOFT_CAP:
        x = s * (scale_log2 / 1.4426950408889634) / soft_cap
        s = soft_cap * (2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0) * 1.4426950408889634
    else:
        s = s * scale_log2
    return s


@triton.jit
def _block_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    locs_ptr,
    starts_ptr,
    counts_ptr,
    row_req_ptr,
    row_block_ptr,
    row_q_start_ptr,
    row_q_len_ptr,
    row_q_pos_ptr,
    req_key_offset_ptr,
    key_tok_start_ptr,
    key_len_ptr,
    num_rows,
    max_cols,
    mask_group,
    kv_group,
    stride_qn,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_on,
    stride_oh,
    scale_log2,
    soft_cap,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFT_CAP: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    mask_head = head // mask_group
    kv_head = head // kv_group
    req = tl.load(row_req_ptr + row)
    diag = tl.load(row_block_ptr + row)
    q_start = tl.load(row_q_start_ptr + row)
    q_len = tl.load(row_q_len_ptr + row)
    q_off = tl.load(row_q_pos_ptr + row) - diag * BLOCK_M  # first query's place in its block
    m = tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    q_live = m < q_len
    q_rows = (q_start + m).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qn + head * stride_qh + d[None, :], mask=q_live[:, None], other=0.0
    )
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_head = k_ptr + kv_head * stride_kh
    v_head = v_ptr + kv_head * stride_vh
    list_at = (mask_head * num_rows + row).to(tl.int64)
    count = tl.load(counts_ptr + list_at)
    starts = starts_ptr + list_at * max_cols
    steps_per_block = BLOCK_M // BLOCK_N
    for i in range(0, count * steps_per_block):
        start = tl.load(starts + i // steps_per_block) + (i % steps_per_block) * BLOCK_N
        loc = tl.load(locs_ptr + start + n)
        k = tl.load(k_head + loc[:, None] * stride_kt + d[None, :])
        s = _softcap_scores(tl.dot(q, tl.trans(k)), soft_cap, scale_log2, SOFT_CAP)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + loc[:, None] * stride_vt + d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    key = tl.load(req_key_offset_ptr + req) + diag
    diag_start = tl.load(key_tok_start_ptr + key)
    diag_len = tl.load(key_len_ptr + key)
    for j in range(0, steps_per_block):
        within = j * BLOCK_N + n
        k_live = within < diag_len
        loc = tl.load(locs_ptr + diag_start + within, mask=k_live, other=0)
        k = tl.load(k_head + loc[:, None] * stride_kt + d[None, :], mask=k_live[:, None], other=0.0)
        s = _softcap_scores(tl.dot(q, tl.trans(k)), soft_cap, scale_log2, SOFT_CAP)
        visible = k_live[None, :] & (within[None, :] <= (q_off + m)[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a key block the row does not reach yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + loc[:, None] * stride_vt + d[None, :], mask=k_live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        o_ptr + q_rows[:, None] * stride_on + head * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=q_live[:, None],
    )


def kept_starts(mask: torch.Tensor, layout: BlockLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (mask head, row), the context-list starts of its kept off-diagonal key blocks in increasing
    order, left-aligned in [Hm, R, C] int64 (the rest unused), and their number [Hm, R] int32."""
    num_cols = mask.shape[-1]
    cols = torch.arange(num_cols, device=mask.device)
    kept = mask & (cols[None, None, :] < layout.row_block[None, :, None])
    place = torch.where(kept, kept.cumsum(-1) - 1, num_cols)
    first_key = layout.req_key_offset[layout.row_req.long()].long()
    key = (first_key[:, None] + cols[None, :]).clamp_max(layout.num_key_blocks - 1)
    starts = torch.zeros(*mask.shape[:2], num_cols + 1, dtype=torch.int64, device=mask.device)
    starts.scatter_(-1, place, layout.key_tok_start[key].expand_as(place).contiguous())
    return starts[..., :num_cols].contiguous(), kept.sum(-1, dtype=torch.int32)


class TritonBlockAttention:
    """Plan (on the device) once, run per layer: causal attention of a batch's queries over the kept
    blocks of the KV pool, the interface `SparsePrefill` drives (as `BlockSparseAttention`'s)."""

    backend = "triton"

    def __init__(self) -> None:
        self._layout: BlockLayout | None = None
        self._locs = torch.empty(0, dtype=torch.int64)
        self._starts = self._counts = torch.empty(0)
        self._mask_heads = 1
        self._sm_scale = 1.0
        self._soft_cap = 0.0

    def plan_mask(
        self,
        mask: torch.Tensor,
        layout: BlockLayout,
        locs: torch.Tensor,
        q: torch.Tensor,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
        num_kv_heads: int | None = None,
    ) -> None:
        """Attend through `mask` [Hm, R, C] (per KV head or per query head) over context slots `locs`
        (`q` and `num_kv_heads` are the FlashInfer planner's: the kernel reads both off its inputs)."""
        del q, num_kv_heads
        self._layout, self._locs = layout, locs
        self._starts, self._counts = kept_starts(mask, layout)
        self._mask_heads = mask.shape[0]
        self._sm_scale, self._soft_cap = sm_scale, logits_soft_cap

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D]; k/v_buffer: the layer's KV pool [T, Hkv, D]; returns [N, Hq, D]."""
        layout = self._layout
        assert layout is not None, "plan_mask() first"
        num_qo_heads, head_dim = q.shape[1], q.shape[2]
        o = torch.empty_like(q)
        if layout.num_rows == 0:
            return o
        k_buffer, v_buffer = (b.view(b.shape[0], -1, head_dim) for b in (k_buffer, v_buffer))
        block_n = min(BLOCK_N, layout.block_size)
        _block_attention_kernel[(layout.num_rows, num_qo_heads)](
            q,
            k_buffer,
            v_buffer,
            o,
            self._locs,
            self._starts,
            self._counts,
            layout.row_req,
            layout.row_block,
            layout.row_q_start,
            layout.row_q_len,
            layout.row_q_pos,
            layout.req_key_offset,
            layout.key_tok_start,
            layout.key_len,
            layout.num_rows,
            self._starts.shape[-1],
            num_qo_heads // self._mask_heads,
            num_qo_heads // k_buffer.shape[1],
            q.stride(0),
            q.stride(1),
            k_buffer.stride(0),
            k_buffer.stride(1),
            v_buffer.stride(0),
            v_buffer.stride(1),
            o.stride(0),
            o.stride(1),
            self._sm_scale * LOG2E,
            self._soft_cap,
            HEAD_DIM=head_dim,
            BLOCK_M=layout.block_size,
            BLOCK_N=block_n,
            SOFT_CAP=self._soft_cap > 0,
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
        )
        return o
