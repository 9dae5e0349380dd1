"""Block geometry of one extend batch: how a chunk at offset P maps onto block-sparse rows and columns.

Blocks are aligned to absolute positions of each request: block i holds positions [i*B, (i+1)*B).
A chunk of n new tokens after a cached prefix of P tokens has query rows for positions [P, P+n), so
its row blocks are i = P//B .. (P+n-1)//B, the first and the last possibly partial; its key blocks
are 0 .. (P+n-1)//B over prefix and chunk together, read from the paged KV cache. Row block i sees
key blocks j < i in full and the diagonal block j = i up to its own last query. The diagonal block's
keys end exactly where its queries end, so FlashInfer's causal mask, which aligns each (query, key)
segment at its bottom-right corner, is exact as long as the diagonal block is the segment's last
key block; selected blocks are laid out in increasing order, and the diagonal is always kept.
A prefix that is not a multiple of B needs nothing special: only the first row block is short.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Rows (query blocks), columns (key blocks) and token ranges of a batch, as int32/int64 tensors.

    Rows are ordered by request, then position; columns of request b occupy
    [key_offset[b], key_offset[b] + num_key_blocks[b]) of the flat key-block list, whose token ranges
    index the flat context list (every position of every request, request after request).
    """

    block_size: int
    num_tokens: int
    max_key_blocks: int
    prefix_lens: tuple[int, ...]  # per request, as given to `build` (host)
    extend_lens: tuple[int, ...]
    row_q_start_host: torch.Tensor  # [R] first query row of each row block, batch-global (CPU)
    row_req: torch.Tensor  # [R] request of each row block
    row_block: torch.Tensor  # [R] absolute block index of each row block
    row_q_start: torch.Tensor  # [R]
    row_q_len: torch.Tensor  # [R]
    row_key_offset: torch.Tensor  # [R] req_key_offset of the row's request
    req_key_offset: torch.Tensor  # [B]
    req_num_key_blocks: torch.Tensor  # [B]
    req_ctx_len: torch.Tensor  # [B] prefix + new tokens
    req_ctx_offset: torch.Tensor  # [B] offset of the request's positions in the flat context list
    key_tok_start: torch.Tensor  # [K] first entry of each key block in the flat context list
    key_len: torch.Tensor  # [K]
    req_prompt_len: torch.Tensor  # [B] int32: the whole prompt's length (at least the context's)
    req_ends_prompt: torch.Tensor  # [B] bool: the extend holds its prompt's last token

    @property
    def num_rows(self) -> int:
        return int(self.row_req.numel())

    @property
    def num_key_blocks(self) -> int:
        return int(self.key_len.numel())

    @property
    def num_context_tokens(self) -> int:
        return int(self.req_ctx_offset[-1] + self.req_ctx_len[-1]) if self.req_ctx_len.numel() else 0

    @classmethod
    def build(
        cls,
        prefix_lens: Sequence[int],
        extend_lens: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
        prompt_lens: torch.Tensor | None = None,
    ) -> BlockLayout:
        """Lay out requests with `prefix_lens[b]` cached and `extend_lens[b]` new tokens (host ints);
        `prompt_lens` [B] on `device`: request b's whole prompt length, past its extend for a chunk before
        the prompt's last (default: every extend ends its prompt)."""
        if len(prefix_lens) != len(extend_lens):
            raise ValueError("prefix_lens and extend_lens differ in length")
        if any(n <= 0 for n in extend_lens) or any(p < 0 for p in prefix_lens):
            raise ValueError("every request needs new tokens and a non-negative prefix")
        bsz = block_size
        rows: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []
        req_meta: list[tuple[int, int, int, int]] = []
        q_offset = key_offset = ctx_offset = 0
        for b, (p, n) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
            ctx = p + n
            blocks = torch.arange(p // bsz, (ctx - 1) // bsz + 1)
            q_lo = torch.clamp(blocks * bsz, min=p)
            q_hi = torch.clamp((blocks + 1) * bsz, max=ctx)
            rows.append(
                torch.stack([torch.full_like(blocks, b), blocks, q_offset + q_lo - p, q_hi - q_lo], 1)
            )
            num_keys = (ctx - 1) // bsz + 1
            k_lo = torch.arange(num_keys) * bsz
            k_hi = torch.clamp(k_lo + bsz, max=ctx)
            keys.append(torch.stack([ctx_offset + k_lo, k_hi - k_lo], 1))
            req_meta.append((key_offset, num_keys, ctx, ctx_offset))
            q_offset += n
            key_offset += num_keys
            ctx_offset += ctx
        row = torch.cat(rows).to(torch.int32)
        key = torch.cat(keys)
        req = torch.tensor(req_meta, dtype=torch.int64)

        def dev(t: torch.Tensor, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return t.to(dtype).contiguous().to(device, non_blocking=True)

        ctx_len = dev(req[:, 2])
        prompt_len = ctx_len if prompt_lens is None else torch.maximum(prompt_lens.to(torch.int32), ctx_len)
        return cls(
            block_size=bsz,
            num_tokens=q_offset,
            prefix_lens=tuple(int(p) for p in prefix_lens),
            extend_lens=tuple(int(n) for n in extend_lens),
            max_key_blocks=int(req[:, 1].max()),
            row_q_start_host=row[:, 2].clone(),
            row_req=dev(row[:, 0]),
            row_block=dev(row[:, 1]),
            row_q_start=dev(row[:, 2]),
            row_q_len=dev(row[:, 3]),
            row_key_offset=dev(req[row[:, 0].long(), 0]),
            req_key_offset=dev(req[:, 0]),
            req_num_key_blocks=dev(req[:, 1]),
            req_ctx_len=ctx_len,
            req_ctx_offset=dev(req[:, 3], torch.int64),
            key_tok_start=dev(key[:, 0], torch.int64),
            key_len=dev(key[:, 1]),
            req_prompt_len=prompt_len,
            req_ends_prompt=prompt_len <= ctx_len,
        )


def context_locs(
    layout: BlockLayout, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor
) -> torch.Tensor:
    """KV-cache slot of every context position of every request, request after request ([M] int64)."""
    return sequence_locs(
        req_to_token, req_pool_indices, layout.req_ctx_len, layout.req_ctx_offset, layout.num_context_tokens
    )


def sequence_locs(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    lens: torch.Tensor,
    offsets: torch.Tensor,
    total: int,
) -> torch.Tensor:
    """KV slots of the first `lens[b]` positions of every request b, packed at `offsets[b]` ([total] int64)."""
    device = req_to_token.device
    req = torch.repeat_interleave(
        torch.arange(lens.numel(), device=device), lens.to(device), output_size=total
    )
    pos = torch.arange(total, device=device) - offsets.to(device)[req]
    return req_to_token[req_pool_indices.to(device).long()[req], pos].long()
