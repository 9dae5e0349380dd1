"""Re-positioning cached keys: a key SGLang cached at position p, re-rotated to q, is the key it
caches at q; plain RoPE and YaRN with Qwen2.5-Coder-1.5B's parameters. The Triton twin runs under
the interpreter here (tests/ops/conftest.py); test_rerotate_gpu.py runs it compiled."""

from __future__ import annotations

import pytest
import torch
from rotary import (
    BF16_TOLERANCE,
    KV_HEADS,
    PLAIN,
    YARN,
    max_relative_error,
    pair_norms,
    rotated,
    sglang_rope,
)

from sglang_prefill_ext.ops.rerotate import rerotate, rerotate_torch, rerotate_triton
from sglang_prefill_ext.ops.rope import Rope, Yarn

pytest.importorskip("sglang.srt.layers.rotary_embedding")

TWINS = [rerotate_torch, rerotate_triton]


@pytest.fixture(scope="module", params=[PLAIN, YARN], ids=["plain", "yarn"])
def rope(request: pytest.FixtureRequest):
    return request.param, sglang_rope(request.param)


def _keys(tokens: int, positions: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, KV_HEADS, 128, generator=gen)
    return (
        k,
        torch.randint(0, positions, (tokens,), generator=gen),
        torch.randint(0, positions, (tokens,), generator=gen),
    )


@pytest.mark.parametrize(
    "yarn",
    [None, Yarn(4.0, 32768), Yarn(8.0, 4096, beta_fast=16, beta_slow=2), Yarn(2.0, 32768, truncate=False)],
)
def test_inverse_frequencies_are_sglang_s(yarn: Yarn | None) -> None:
    rope = Rope(128, 1e6, yarn)
    assert torch.equal(rope.inv_freq(), sglang_rope(rope).inv_freq)


@pytest.mark.parametrize("twin", TWINS)
def test_a_key_moved_from_p_to_q_is_the_key_rotated_at_q_in_float32(rope, twin) -> None:
    ours, sglang = rope
    k, p, q = _keys(512, len(sglang.cos_sin))
    got = twin(rotated(k, p, sglang.cos_sin), p, q, ours)
    assert max_relative_error(got, rotated(k, q, sglang.cos_sin)) < 1e-5


def test_one_rotation_by_the_position_delta_is_not_that_exact(rope) -> None:
    """Why rerotate composes the two positions' angles: rotating by float32((q - p) * inv_freq)
    misses the table's angle at q by up to an ulp of it (~0.01 rad near 1e5 positions)."""
    ours, sglang = rope
    k, p, q = _keys(512, len(sglang.cos_sin))
    angle = ((q - p).float()[:, None] * ours.inv_freq())[:, None, :]
    x1, x2 = rotated(k, p, sglang.cos_sin).chunk(2, dim=-1)
    by_delta = torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), dim=-1)
    assert max_relative_error(by_delta, rotated(k, q, sglang.cos_sin)) > 1e-3


@pytest.mark.parametrize("twin", TWINS)
def test_a_bf16_key_moved_from_p_to_q_is_the_key_cached_at_q_within_bf16(rope, twin) -> None:
    ours, sglang = rope
    k, p, q = _keys(512, len(sglang.cos_sin), seed=1)
    cached = rotated(k, p, sglang.cos_sin).bfloat16()
    got = twin(cached, p, q, ours)
    assert got.dtype == torch.bfloat16
    exact = rotated(k, q, sglang.cos_sin)
    assert max_relative_error(got, exact) < BF16_TOLERANCE
    assert max_relative_error(exact.bfloat16(), exact) < 2.0**-8  # the bound's one rounding


def test_yarn_s_attention_factor_stays_as_cached() -> None:
    """SGLang's YaRN table scales cos and sin by mscale, so cached keys are mscale times longer; a
    re-rotation keeps every pair's norm: it neither applies mscale again nor takes it off."""
    sglang = sglang_rope(YARN)
    assert sglang.mscale == pytest.approx(1.1386, abs=1e-4)
    k, p, q = _keys(64, len(sglang.cos_sin))
    cached = rotated(k, p, sglang.cos_sin)
    torch.testing.assert_close(pair_norms(cached), sglang.mscale * pair_norms(k), rtol=1e-5, atol=0)
    torch.testing.assert_close(
        pair_norms(rerotate(cached, p, q, YARN)), pair_norms(cached), rtol=1e-5, atol=0
    )


@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_triton_and_torch_twins_agree(head_dim: int) -> None:
    """Float32 to rounding; bf16 to one unit in the last place (the interpreter truncates where
    torch rounds to nearest); a strided view of a pool reads as its copy would."""
    rope = Rope(head_dim, 1e4)
    gen = torch.Generator().manual_seed(2)
    pool = torch.randn(300, 4, head_dim, generator=gen)
    k = pool[::3, 1:3]
    p, q = torch.randint(0, 4096, (2, len(k)), generator=gen)
    torch.testing.assert_close(
        rerotate_triton(k, p, q, rope), rerotate_torch(k, p, q, rope), rtol=0, atol=2e-6
    )
    ours, theirs = (twin(k.bfloat16(), p, q, rope).view(torch.int16).int() for twin in TWINS)
    assert int((ours - theirs).abs().max()) <= 1


def test_same_positions_give_back_the_keys_and_no_tokens_give_nothing() -> None:
    k, p, _ = _keys(32, 32768)
    torch.testing.assert_close(rerotate(k, p, p, PLAIN), k, rtol=0, atol=1e-6)
    empty = torch.empty(0, KV_HEADS, 128)
    none = torch.empty(0, dtype=torch.int64)
    assert all(twin(empty, none, none, PLAIN).shape == (0, KV_HEADS, 128) for twin in TWINS)


@pytest.mark.parametrize("twin", TWINS)
def test_malformed_shapes_are_refused(twin) -> None:
    k, p, q = _keys(8, 100)
    with pytest.raises(ValueError, match=r"k must be \[tokens, heads, 128\]"):
        twin(k[..., :64], p, q, PLAIN)
    with pytest.raises(ValueError, match=r"positions must be \[8\]"):
        twin(k, p[:7], q, PLAIN)
    with pytest.raises(ValueError, match="positive even"):
        Rope(127, 1e4)
