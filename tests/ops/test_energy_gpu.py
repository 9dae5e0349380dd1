"""On the GPU: the block energy kernel against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kvpool import make_pool

from sglang_prefill_ext.ops import BlockLayout
from sglang_prefill_ext.ops.energy import block_energy_reference, block_energy_triton
from sglang_prefill_ext.ops.layout import context_locs
from sglang_prefill_ext.ops.pooling import key_segments, pool_keys

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((9, 3), 64)])
@pytest.mark.parametrize("per_head", [False, True])
def test_energy_kernel_matches_torch_on_gpu(heads: tuple[int, int], head_dim: int, per_head: bool) -> None:
    prefix, extend = [2000, 0, 300], [900, 3000, 5]
    pool = make_pool(
        [p + n for p, n in zip(prefix, extend, strict=True)], 16, heads[1], head_dim, device=DEVICE
    )
    layout = BlockLayout.build(prefix, extend, 128, DEVICE)
    k_mean = pool_keys(
        pool.k, key_segments(layout, context_locs(layout, pool.req_to_token, pool.req_pool_indices))
    )
    q = (3.0 * torch.randn(layout.num_tokens, heads[0], head_dim, device=DEVICE)).bfloat16()
    tile_heads = 1 if per_head else heads[0] // heads[1]
    got = block_energy_triton(q, k_mean, layout, head_dim**-0.5, tile_heads)
    want = block_energy_reference(q, k_mean, layout, head_dim**-0.5, tile_heads)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
