"""On the GPU: the compiled re-positioning kernel against keys SGLang's table rotates at the new
positions, over Qwen2.5-Coder-1.5B's whole position range (plain, and YaRN x4 to 131072)."""

from __future__ import annotations

import pytest
import torch
from rotary import BF16_TOLERANCE, KV_HEADS, PLAIN, YARN, max_relative_error, rotated, sglang_rope

from sglang_prefill_ext.ops.rerotate import rerotate, rerotate_torch, rerotate_triton

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


@pytest.mark.parametrize("rope", [PLAIN, YARN], ids=["plain", "yarn"])
def test_a_chunk_of_keys_moved_on_the_gpu_is_the_keys_cached_at_its_new_positions(rope) -> None:
    """64K cached keys (a chunk per 2K tokens) each moved to a random new start."""
    sglang = sglang_rope(rope)
    positions = len(sglang.cos_sin)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    tokens, chunk = 65536, 2048
    k = torch.randn(tokens, KV_HEADS, 128, device=DEVICE, generator=gen)
    starts = torch.randint(0, positions - chunk, (2, tokens // chunk), device=DEVICE, generator=gen)
    offsets = torch.arange(chunk, device=DEVICE).repeat(tokens // chunk)
    p, q = (s.repeat_interleave(chunk) + offsets for s in starts)
    exact = rotated(k, q, sglang.cos_sin)
    assert max_relative_error(rerotate(rotated(k, p, sglang.cos_sin), p, q, rope), exact) < 1e-5
    got = rerotate(rotated(k, p, sglang.cos_sin).bfloat16(), p, q, rope)
    assert got.dtype == torch.bfloat16 and max_relative_error(got, exact) < BF16_TOLERANCE


def test_the_compiled_kernel_is_the_torch_twin_to_one_bf16_ulp() -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    pool = torch.randn(4096, 4, 128, device=DEVICE, generator=gen).bfloat16()
    k = pool[::2, 1:3]
    p, q = torch.randint(0, 131072, (2, len(k)), device=DEVICE, generator=gen)
    ours, theirs = (twin(k, p, q, YARN).view(torch.int16).int() for twin in (rerotate_triton, rerotate_torch))
    assert int((ours - theirs).abs().max()) <= 1
    assert torch.equal(rerotate(k, p, q, YARN), rerotate_triton(k, p, q, YARN))
