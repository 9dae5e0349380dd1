"""The Triton exact block mass (the bf16 oracle's) is the torch one's twin."""

from __future__ import annotations

import pytest
import torch

from sglang_prefill_ext.ops.exact import exact_block_mass, exact_block_mass_triton


@pytest.mark.parametrize(("length", "per_query_head"), [(300, True), (256, False), (17, True)])
def test_the_triton_exact_block_mass_is_the_torch_one(length: int, per_query_head: bool) -> None:
    """Causal blocks only, each row's attention summed over its block (rows past the prompt: none), on
    lengths off and on the block grid."""
    torch.manual_seed(0)
    q, k = torch.randn(length, 6, 16) * 2, torch.randn(length, 2, 16) * 2
    want = exact_block_mass(q, k, 0.25, 32, 64, per_query_head)
    got = exact_block_mass_triton(q, k, 0.25, 32, per_query_head)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    rows = torch.full((want.shape[1],), 32.0)
    rows[-1] = length - 32 * (want.shape[1] - 1)
    group = 1 if per_query_head else 3
    torch.testing.assert_close(
        got.sum(-1), (group * rows)[None].expand(got.shape[0], -1), atol=1e-3, rtol=1e-4
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_the_bf16_exact_block_mass_on_the_gpu_is_the_fp32_one() -> None:
    """Qwen2.5-Coder-1.5B's shape at 4K: the kernel on bf16 queries and keys (what the bf16 oracle reads)
    ranks blocks by the fp32 torch mass, within bf16's rounding."""
    torch.manual_seed(0)
    q, k = (torch.randn(4096, h, 128, device="cuda", dtype=torch.bfloat16) for h in (12, 2))
    want = exact_block_mass(q.float(), k.float(), 128**-0.5, 128, 1024, per_query_head=True)
    got = exact_block_mass_triton(q, k, 128**-0.5, 128, per_query_head=True)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
