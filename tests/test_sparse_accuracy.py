"""bench.accuracy.sparse_accuracy's fp32 emulation on a tiny random Llama (no download): the chunked exact
attention is SDPA, and keeping every block is dense."""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

import pytest
import torch

from tests.tiny_models import tiny

LENGTH, BLOCK = 300, 32


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return importlib.import_module("bench.accuracy.sparse_accuracy")


@pytest.fixture(scope="module")
def model():
    return tiny(
        vocab_size=128, hidden_size=96, num_attention_heads=6, max_position_embeddings=LENGTH,
        initializer_range=0.02,
    )  # fmt: skip


def _logits(model, tokens: torch.Tensor, name: str, attention) -> torch.Tensor:
    from transformers import AttentionInterface

    if attention is not None:
        AttentionInterface.register(name, attention)
    model.set_attn_implementation(name)
    with torch.no_grad():
        return model(tokens).logits[0]


def _emulated(bench: ModuleType, settings, oracle=None):
    """The bench's emulated policy over `settings`, its first layer dense, never declined for density."""
    settings = dataclasses.replace(settings, dense_layers=1, max_density=1.0)
    return bench.SparseAttention(bench.EmulatedPrefill(settings, oracle), emulate=True)


def test_chunked_exact_attention_equals_sdpa(bench: ModuleType, model) -> None:
    tokens = torch.randint(0, 128, (1, LENGTH))
    sdpa = _logits(model, tokens, "sdpa", None)
    exact = _logits(model, tokens, "test_exact", bench.exact_attention)
    torch.testing.assert_close(exact, sdpa, atol=1e-4, rtol=1e-4)


def test_every_block_kept_gives_dense_logits(bench: ModuleType, model) -> None:
    from sglang_prefill_ext.ops import SparseSettings

    tokens = torch.randint(0, 128, (1, LENGTH))
    dense = _logits(model, tokens, "test_exact", bench.exact_attention)
    settings = SparseSettings(block_size=BLOCK, scorer="pooled", threshold=0.0, per_query_head=False)
    attention = _emulated(bench, settings)
    sparse = _logits(model, tokens, "test_sparse", attention)
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)
    summary = bench.density_summary(attention.densities)
    assert summary["density"] == 1.0
    assert sorted(summary["density_per_head"]) == [1, 2, 3]
    assert all(heads == [1.0, 1.0] for heads in summary["density_per_head"].values())


@pytest.mark.parametrize(
    "spec", ["oracle:1@q", "oracle:1@layer", "oracle:1@q,layer,b64", "pooled:0@q", "antidiagonal:1@q,x4"]
)
def test_every_block_kept_per_query_head_and_per_layer_gives_dense_logits(
    bench: ModuleType, model, spec: str
) -> None:
    """A whole-mass oracle (per query block or per layer, per KV or query head) and a zero threshold
    per query head keep every causal block: the emulated forward is dense, one density per query head."""
    config = bench.parse_config(spec)
    tokens = torch.randint(0, 128, (1, LENGTH))
    dense = _logits(model, tokens, "test_exact", bench.exact_attention)
    oracle = bench.Oracle(config.whole_layer) if config.scorer == "oracle" else None
    settings = config.settings(BLOCK, 2, 4)
    attention = _emulated(bench, settings, oracle)
    torch.testing.assert_close(_logits(model, tokens, f"test_{spec}", attention), dense, atol=1e-5, rtol=1e-5)
    heads = bench.density_summary(attention.densities)["density_per_head"]
    assert all(h == [1.0] * (6 if config.per_query_head else 2) for h in heads.values())


def test_oracle_below_whole_mass_keeps_fewer_blocks(bench: ModuleType, model) -> None:
    """The per-layer rule at the same mass never keeps more pairs than it needs: its density at 0.5 is
    below 1 and the forward differs from dense."""
    tokens = torch.randint(0, 128, (1, LENGTH))
    for spec in ("oracle:0.5", "oracle:0.5@layer", "oracle:0.5@q"):
        config = bench.parse_config(spec)
        settings = config.settings(BLOCK, 2, 0)
        attention = _emulated(bench, settings, bench.Oracle(config.whole_layer))
        _logits(model, tokens, f"test_{spec}", attention)
        assert bench.density_summary(attention.densities)["density"] < 1.0


@pytest.mark.parametrize(("per_query_head", "mass"), [(True, 0.6), (False, 0.5), (True, 1.0)])
def test_the_one_pass_oracle_is_the_two_pass_one(
    bench: ModuleType, per_query_head: bool, mass: float
) -> None:
    """Selecting from the exact block mass and attending over the kept blocks in one pass over the scores
    keeps the blocks and gives the output of the two passes (`exact_block_mass`, `select_by_mass`,
    `block_sparse_attention`), on a length that is no multiple of the block or the chunk."""
    from sglang_prefill_ext.ops import BlockLayout, SparseSettings
    from sglang_prefill_ext.ops.exact import block_sparse_attention, exact_block_mass, selected_attention
    from sglang_prefill_ext.ops.selection import select_by_mass

    torch.manual_seed(0)
    q, k, v = torch.randn(LENGTH, 6, 16) * 2, torch.randn(LENGTH, 2, 16) * 2, torch.randn(LENGTH, 2, 16)
    settings = SparseSettings(block_size=BLOCK, mass=mass, local_blocks=1, per_query_head=per_query_head)
    layout = BlockLayout.build([0], [LENGTH], BLOCK, q.device)
    scale = 16**-0.5
    two_pass = select_by_mass(exact_block_mass(q, k, scale, BLOCK, 64, per_query_head), layout, settings)
    out, one_pass = selected_attention(
        q, k, v, scale, bench.rows_by_mass(layout, settings), BLOCK, 64, per_query_head
    )
    assert torch.equal(one_pass, two_pass)
    causal = one_pass.shape[0] * int((layout.row_block.long() + 1).sum())
    assert (int(one_pass.sum()) == causal) == (mass == 1.0)
    torch.testing.assert_close(
        out, block_sparse_attention(q, k, v, scale, two_pass, BLOCK), atol=1e-5, rtol=1e-5
    )


def test_text_scores_match_the_models_own_loss(bench: ModuleType, model) -> None:
    """Perplexity from chunked final hidden states equals exp(cross-entropy) of the full logits, and
    a forward compared with itself agrees everywhere with zero KL."""
    tokens = torch.randint(0, 128, (1, LENGTH))
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        loss = model(tokens, labels=tokens).loss
        hidden = bench.final_hidden(model, tokens)
        scores = bench.TextScores(model.lm_head, tokens[0])
        row = scores.score(hidden, hidden)
    assert row["ppl"] == pytest.approx(float(loss.exp()), rel=1e-4)
    assert row["top1"] == 1.0 and row["kl"] == pytest.approx(0.0, abs=1e-6)
    logits = model.lm_head(hidden[:-1])
    assert row["next_acc"] == pytest.approx(float((logits.argmax(-1) == tokens[0, 1:]).float().mean()))


def test_numbered_options_set_their_settings(bench: ModuleType) -> None:
    settings = bench.parse_config("sampled:0.9@q,s8,b64").settings(128, 2, 4)
    assert (settings.samples, settings.block_size, settings.per_query_head) == (8, 64, True)
    settings = bench.parse_config("antidiagonal:0.9@x16").settings(128, 2, 4)
    assert (settings.scorer, settings.stride, settings.mass, settings.samples) == ("antidiagonal", 16, 0.9, 2)


@pytest.mark.parametrize(
    "bad",
    [
        "oracle",
        "hybrid:0.1",
        "oracle:0.9@x",
        "pooled:0.1@layer",
        "nope:1",
        "antidiagonal:0.9@s",
        "oracle:0.9@M1-2",
        "oracle:0.9@M1=1",
        "antidiagonal:0.9@S1-2",
        "antidiagonal:0.9@S1-2=3",
    ],
)
def test_malformed_configs_are_refused(bench: ModuleType, bad: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_config(bad)


def test_the_default_config_is_the_servers_selection(bench: ModuleType) -> None:
    """Without --configs the bench measures what `--prefill-ext-sparse` runs by default."""
    from sglang_prefill_ext.ops.settings import SparseSettings

    want = SparseSettings()
    settings = bench.parse_config(bench.default_config()).settings(
        want.block_size, want.samples, want.local_blocks
    )
    assert settings == want


@pytest.mark.parametrize(("spec", "declined"), [("pooled:0", False), ("oracle:0.3", True)])
def test_the_guard_is_reported_and_a_declined_forward_is_dense(
    bench: ModuleType, model, spec: str, declined: bool
) -> None:
    """Guard 0.9, every sparse layer checked: keeping every block passes each with a statistic of 1; an oracle
    at mass 0.3 fails at the first sparse layer, whose forward then runs the exact dense attention."""
    config = bench.parse_config(spec)
    settings = dataclasses.replace(config.settings(BLOCK, 2, 0), guard=0.9, guard_every=1)
    oracle = bench.Oracle() if config.scorer == "oracle" else None
    attention = _emulated(bench, settings, oracle)
    tokens = torch.randint(0, 128, (1, LENGTH))
    dense = _logits(model, tokens, "test_exact", bench.exact_attention)
    sparse = _logits(model, tokens, f"test_guard_{spec}", attention)
    assert attention.declined == declined
    summary = bench.guard_summary(attention.guards)
    if declined:
        torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)
        assert list(summary["guard_per_layer"]) == [1] and summary["guard"] < 0.9
    else:
        assert list(summary["guard_per_layer"]) == [1, 2, 3]
        assert summary["guard_min"] == pytest.approx(1.0, abs=1e-5)
    assert bench.guard_summary([{}]) == {}  # off: nothing reported


def test_a_layer_range_selects_at_its_own_mass(bench: ModuleType, model) -> None:
    """`MA-B=X`: the named layers select at mass X, the others at the config's mass. At X = 1 over every
    sparse layer the forward is dense; over layers 2-3 only those keep every block, layer 1 keeps fewer."""
    tokens = torch.randint(0, 128, (1, LENGTH))
    dense = _logits(model, tokens, "test_exact", bench.exact_attention)

    def run(spec: str):
        config = bench.parse_config(spec)
        settings = dataclasses.replace(config.settings(BLOCK, 2, 0), dense_layers=1, max_density=1.0)
        assert settings.layer_mass == spec.partition("@M")[2]
        attention = bench.SparseAttention(bench.EmulatedPrefill(settings, bench.Oracle()), True)
        return _logits(model, tokens, f"test_{spec}", attention), attention.densities[-1]

    every, _ = run("oracle:0.3@M1-3=1")
    torch.testing.assert_close(every, dense, atol=1e-5, rtol=1e-5)
    _, densities = run("oracle:0.3@M2-3=1")
    assert all(d == 1.0 for layer in (2, 3) for d in densities[layer])
    assert max(densities[1]) < 1.0


def test_a_layer_range_selects_at_its_own_stride(bench: ModuleType, model) -> None:
    """`SA-B=S`: the named layers score at antidiagonal stride S, the others at the config's (`xN`). Over
    every sparse layer the forward is the one at stride S everywhere; over layers 2-3, layer 1 selects as at
    the config's stride."""
    tokens = torch.randint(0, 128, (1, LENGTH))

    def run(spec: str):
        config = bench.parse_config(spec)
        attention = _emulated(bench, config.settings(BLOCK, 2, 0))
        return _logits(model, tokens, f"test_{spec}", attention), attention.densities[-1], config

    fine, fine_densities, _ = run("antidiagonal:0.3@x2")
    named, named_densities, config = run("antidiagonal:0.3@x16,S1-3=2")
    assert config.layer_stride == "1-3=2"
    assert torch.equal(named, fine) and named_densities == fine_densities
    _, coarse_densities, _ = run("antidiagonal:0.3@x16")
    _, densities, config = run("antidiagonal:0.3@x16,S2-2=2,S3-3=4")
    assert config.layer_stride == "2-2=2,3-3=4"
    assert densities[1] == coarse_densities[1] != fine_densities[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("mass", [1.0, 0.5])
def test_the_bf16_oracle_runs_the_served_kernel_over_its_selection(bench: ModuleType, mass: float) -> None:
    """`OraclePrefill` in bf16: keeping every block gives dense's logits within bf16 rounding (FlashInfer over
    the kept blocks, SDPA dense); half the mass keeps fewer blocks and still runs."""
    from sglang_prefill_ext.ops import SparseSettings
    from sglang_prefill_ext.ops.attention import BlockSparseAttention

    model = tiny(
        hidden_size=768, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
        initializer_range=0.02,
    ).to("cuda", torch.bfloat16)  # fmt: skip
    tokens = torch.randint(0, 128, (1, 1500), device="cuda")
    dense = _logits(model, tokens, "sdpa", None).float()
    settings = dataclasses.replace(
        SparseSettings(block_size=128, mass=mass, local_blocks=1), dense_layers=1, max_density=1.0
    )
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    oracle = bench.OraclePrefill(settings, BlockSparseAttention(workspace), bench.Oracle())
    attention = bench.SparseAttention(oracle, emulate=False)
    sparse = _logits(model, tokens, f"test_bf16_oracle_{mass}", attention).float()
    density = bench.density_summary(attention.densities)["density"]
    if mass == 1.0:
        assert density == 1.0
        torch.testing.assert_close(sparse.softmax(-1), dense.softmax(-1), atol=2e-2, rtol=0)
    else:
        assert density < 1.0 and torch.isfinite(sparse).all()
