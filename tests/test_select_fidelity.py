"""bench.accuracy.select_fidelity on a tiny random Qwen2 (no download): the captured queries and keys are the
model's own, and the kept share of the exact attention is what each selection holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.accuracy import select_fidelity
from sglang_prefill_ext.ops.settings import SparseSettings
from tests.tiny_models import tiny

LENGTH, BLOCK = 256, 16


@pytest.fixture(scope="module")
def captured() -> dict:
    model = tiny(
        "qwen2", hidden_size=96, num_hidden_layers=3, num_attention_heads=6, max_position_embeddings=512
    )
    ids = torch.randint(0, 256, (LENGTH,), generator=torch.Generator().manual_seed(0)).tolist()
    return select_fidelity.capture(model, ids, {0, 2})


def test_capture_keeps_each_asked_layer_s_queries_and_keys(captured: dict) -> None:
    assert sorted(captured) == [0, 2]
    q, k, scale = captured[2]
    assert q.shape == (LENGTH, 6, 16) and k.shape == (LENGTH, 2, 16)
    assert scale == pytest.approx(16**-0.5)


@pytest.mark.parametrize("mass", [0.5, 0.8])
def test_the_oracle_keeps_at_least_its_mass_of_every_row(captured: dict, mass: float) -> None:
    q, k, scale = captured[2]
    settings = SparseSettings(mass=mass, block_size=BLOCK, local_blocks=1, stride=4)
    f = select_fidelity.fidelity(
        2, q, k, scale, select_fidelity.exact_mass(q, k, scale, BLOCK), select_fidelity.ORACLE, settings
    )
    assert f.kept_p1 >= mass - 1e-5
    assert 0 < f.density < 1


def test_keeping_every_block_keeps_all_the_attention(captured: dict) -> None:
    q, k, scale = captured[0]
    settings = SparseSettings(mass=1.0, block_size=BLOCK, stride=4)
    for scorer in (select_fidelity.ORACLE, "antidiagonal"):
        f = select_fidelity.fidelity(
            0, q, k, scale, select_fidelity.exact_mass(q, k, scale, BLOCK), scorer, settings
        )
        assert (f.density, f.kept_mean, f.kept_p1) == pytest.approx((1.0, 1.0, 1.0))


def test_a_scorer_at_a_higher_mass_keeps_more_of_the_attention(captured: dict) -> None:
    q, k, scale = captured[2]
    settings = SparseSettings(mass=0.7, block_size=BLOCK, local_blocks=1, stride=4)
    low = select_fidelity.fidelity(
        2, q, k, scale, select_fidelity.exact_mass(q, k, scale, BLOCK), "antidiagonal", settings
    )
    high = select_fidelity.fidelity(
        2,
        q,
        k,
        scale,
        select_fidelity.exact_mass(q, k, scale, BLOCK),
        "antidiagonal",
        dataclasses.replace(settings, mass=0.99),
    )
    assert high.density > low.density
    assert high.kept_mean > low.kept_mean
