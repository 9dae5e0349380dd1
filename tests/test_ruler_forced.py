"""bench.accuracy.ruler_forced on a tiny random Llama (no download): the forced item over the cached haystack is
the full prompt's own log-probability, an item is right exactly when greedy decoding writes the answer, and a
policy keeping every block scores as dense."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch

from tests.tiny_models import tiny

LENGTH, BLOCK = 256, 32


@pytest.fixture(scope="module")
def forced() -> ModuleType:
    return importlib.import_module("bench.accuracy.ruler_forced")


@pytest.fixture(scope="module")
def model():
    return tiny(
        vocab_size=128, hidden_size=96, num_hidden_layers=3, num_attention_heads=6,
        max_position_embeddings=2 * LENGTH, initializer_range=0.02,
    )  # fmt: skip


def full_logprob(model, ids: list[int], answer: list[int]) -> float:
    with torch.no_grad():
        logp = model(torch.tensor([ids + answer])).logits[0].float().log_softmax(-1)
    rows = torch.arange(len(ids) - 1, len(ids) + len(answer) - 1)
    return float(logp[rows, torch.tensor(answer)].sum())


def test_answer_ids_split_question_and_answer(forced: ModuleType) -> None:
    from bench.accuracy import tasks

    question = tasks.Question("single", "What is it?\nAnswer: It is", ("4217",), 12)
    asked, answer = forced.answer_ids(lambda t: [ord(c) for c in t], question)
    assert "".join(map(chr, asked)) == "\n\nWhat is it?\nAnswer: It is"
    assert "".join(map(chr, answer)) == " 4217"


def test_forced_item_over_the_cache_is_the_whole_prompts_logprob(forced: ModuleType, model) -> None:
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(1)
    context = torch.randint(0, 128, (LENGTH,), generator=gen).tolist()
    asked, answer = [5, 6, 7], [9, 10, 11, 12]
    cache = DynamicCache()
    with torch.no_grad():
        model.model(torch.tensor([context]), past_key_values=cache, use_cache=True)
        first = forced.forced_item(model, cache, LENGTH, asked, answer)
        again = forced.forced_item(model, cache, LENGTH, asked, answer)  # the crop left the haystack alone
    assert first == again
    assert first[1] == pytest.approx(full_logprob(model, context + asked, answer), abs=1e-4)
    with torch.no_grad():
        greedy = model.generate(
            torch.tensor([context + asked]), max_new_tokens=4, do_sample=False, pad_token_id=0
        )[0, -4:].tolist()
    cache = DynamicCache()
    with torch.no_grad():
        model.model(torch.tensor([context]), past_key_values=cache, use_cache=True)
        assert forced.forced_item(model, cache, LENGTH, asked, greedy)[0]
        wrong = [(greedy[0] + 1) % 128, *greedy[1:]]
        assert not forced.forced_item(model, cache, LENGTH, asked, wrong)[0]


def test_keeping_every_block_scores_as_dense(forced: ModuleType, model) -> None:
    from bench.accuracy import sparse_accuracy, tasks
    from sglang_prefill_ext.ops import SparseSettings

    gen = torch.Generator().manual_seed(2)
    context = torch.randint(0, 128, (LENGTH,), generator=gen).tolist()
    question = tasks.Question("single", "q", ("1",), 4)
    items = [(question, [5, 6], [7, 8]), (question, [9], [10, 11])]
    settings = SparseSettings(block_size=BLOCK, mass=1.0, max_density=1.0)
    policy = sparse_accuracy.SparseAttention(sparse_accuracy.EmulatedPrefill(settings), emulate=True)
    with torch.no_grad():
        sparse_accuracy.use_attention(model, "test_forced_sparse", policy)
        sparse, _ = forced.run_config(model, context, items, "sdpa")
        dense, _ = forced.run_config(model, context, items, "sdpa")
    assert [r for r, _ in sparse] == [r for r, _ in dense]
    for (_, s), (_, d) in zip(sparse, dense, strict=True):
        assert s == pytest.approx(d, abs=1e-3)
    assert policy.densities[-1], "the haystack ran through the policy"


def test_summary_counts_lost_gained_and_logprob_change(forced: ModuleType) -> None:
    def row(family: str, right: bool, logprob: float, first: bool, density: float | None = None) -> dict:
        return dict(family=family, right=right, logprob=logprob, first=first, forward_s=2.0, density=density)

    rows = {
        "dense": [row("single", True, -1.0, True), row("single", True, -2.0, False), row("multikey", False, -5.0, False)],
        "sp": [row("single", False, -4.0, True, 0.2), row("single", True, -2.5, False), row("multikey", True, -1.0, True, 0.3)],
    }  # fmt: skip
    summary = forced.summarize(rows)
    single = summary["sp"]["families"]["single"]
    assert (single["n"], single["dense"], single["right"], single["lost"], single["gained"]) == (
        2,
        2,
        1,
        1,
        0,
    )
    assert single["dlogprob"] == pytest.approx(-1.75)
    assert summary["sp"]["families"]["multikey"]["gained"] == 1
    assert summary["sp"]["density"] == pytest.approx(0.25)
    assert summary["dense"]["families"]["single"]["lost"] == 0


def _summary(**configs: tuple[int, int, float, float]) -> dict:
    """name -> (lost, gained, dlogprob, density), one family of 10 items."""
    return {
        name: dict(
            families={"single": dict(n=10, lost=lost, gained=gained, dlogprob=dlogprob)}, density=density
        )
        for name, (lost, gained, dlogprob, density) in configs.items()
    }


def test_the_dev_rule_takes_the_least_dense_config_that_keeps_every_answer(forced: ModuleType) -> None:
    a, b, c = "antidiagonal:0.8@x16,q", "antidiagonal:0.8@x16,q,d0.05", "antidiagonal:0.9@x16,q"
    summary = _summary(**{a: (2, 0, -0.5, 0.10), b: (1, 1, -0.1, 0.10), c: (0, 0, -0.2, 0.15)})
    assert forced.choose(summary, [a, b, c]) == b  # passes (net 0), as dense as a
    summary[b]["families"]["single"]["lost"] = 2
    assert forced.choose(summary, [a, b, c]) == c  # the only one passing
    summary[c]["families"]["single"]["lost"] = 3
    assert forced.choose(summary, [a, b, c]) == b  # none passes: fewest net lost, then log-probability


def test_the_dev_rule_by_forward_time_takes_the_fastest_passing_config(forced: ModuleType) -> None:
    fine, mixed, coarse = "antidiagonal:0.9@x4,q", "antidiagonal:0.9@x16,q,S7-20=4", "antidiagonal:0.9@x16,q"
    summary = _summary(**{fine: (1, 1, -0.1, 0.20), mixed: (2, 2, -0.2, 0.21), coarse: (3, 1, -0.3, 0.19)})
    for name, seconds in ((fine, 1.4), (mixed, 1.1), (coarse, 0.9)):
        summary[name]["forward_s"] = seconds
    assert forced.choose(summary, [fine, mixed, coarse]) == fine  # the least dense passing one
    assert forced.choose(summary, [fine, mixed, coarse], by="forward_s") == mixed  # the fastest passing one


def _served(flags: list[str]):
    """The SparseSettings a server started with `server_flags`' `flags` runs."""
    from sglang_prefill_ext.config import PrefillExtConfig

    pairs = dict(zip(flags[2::2], flags[3::2], strict=True))
    options = {k.removeprefix("--prefill-ext-").replace("-", "_"): v for k, v in pairs.items()}
    return PrefillExtConfig.from_options(options).sparse_settings


def test_server_flags_give_the_configs_selection(forced: ModuleType) -> None:
    flags = forced.server_flags("antidiagonal:0.8@x4,q")
    assert flags[:2] == ["--enable-prefill-ext", "--prefill-ext-sparse"]
    assert flags[2:] == ["--prefill-ext-sparse-mass", "0.8"]
    with pytest.raises(ValueError, match="layer range"):
        forced.server_flags("antidiagonal:0.8@x16,q,L7-13")
    budgets = forced.server_flags("antidiagonal:0.8@x4,q,M7-20=0.97,M0-3=0.7")
    assert budgets[-2:] == ["--prefill-ext-sparse-layer-mass", "7-20=0.97,0-3=0.7"]
    assert forced.server_flags("antidiagonal:0.9@x4,q") == flags[:2]  # the server's defaults
    assert forced.server_flags("antidiagonal:0.9@x16,q")[2:] == ["--prefill-ext-sparse-stride", "16"]
    assert _served(flags).mass == 0.8


def test_server_flags_give_the_configs_layer_strides(forced: ModuleType) -> None:
    """`SA-B=S` options: the server's --prefill-ext-sparse-layer-stride, each layer at its config's stride."""
    flags = forced.server_flags("antidiagonal:0.9@x16,q,S7-20=4,S0-1=8")
    assert flags[2:] == [
        "--prefill-ext-sparse-stride",
        "16",
        "--prefill-ext-sparse-layer-stride",
        "7-20=4,0-1=8",
    ]
    served = _served(flags)
    assert [served.at_layer(layer).stride for layer in (0, 2, 7, 20, 21)] == [8, 16, 4, 4, 16]


def test_closer_counts_the_items_each_run_keeps_nearer_dense(forced: ModuleType) -> None:
    def rows(*logprobs: float) -> dict:
        return {(130000, 1000 + i, "single", 0): dict(logprob=x) for i, x in enumerate(logprobs)}

    dense = rows(-1.0, -1.0, -1.0, -1.0)
    a = rows(-1.1, -0.9, -3.0, -1.0)
    b = rows(-2.0, -1.5, -1.2, -1.0)  # the last item a tie: counted for neither
    assert forced.closer(dense, a, b) == (2, 1, 1.0)
    assert forced.closer(dense, b, a)[:2] == (1, 2)
    with pytest.raises(ValueError, match="differ"):
        forced.closer(dense, a, rows(-1.0, -1.0, -1.0))


def test_merged_runs_are_one_run_over_their_cases(forced: ModuleType, tmp_path) -> None:
    def rows(seed: int, right: bool) -> dict[str, list[dict]]:
        item = dict(length=100, seed=seed, family="single", ask=0, right=True, logprob=-1.0, first=True)
        item["forward_s"] = 1.0
        return {
            "dense": [dict(item, label="dense", density=None)],
            "oracle:0.9@q": [dict(item, label="oracle:0.9@q", right=right, logprob=-2.0, density=0.2 + seed)],
        }

    forced.write(tmp_path / "a", rows(1, False))
    forced.write(tmp_path / "b", rows(2, True))
    merged = forced.merge([tmp_path / "a", tmp_path / "b"])
    summary = forced.summarize(merged)["oracle:0.9@q"]
    assert (summary["families"]["single"]["n"], summary["families"]["single"]["lost"]) == (2, 1)
    assert summary["density"] == pytest.approx(1.7)
    with pytest.raises(ValueError, match="twice"):
        forced.merge([tmp_path / "a", tmp_path / "a"])
    (tmp_path / "a" / "dense.jsonl").unlink()
    with pytest.raises(ValueError, match="configs"):
        forced.merge([tmp_path / "b", tmp_path / "a"])


def test_the_guard_answers_a_declined_case_as_dense(forced: ModuleType) -> None:
    def rows(right: list[bool], guards: list[dict | None] | None = None) -> dict:
        out = {}
        for i, r in enumerate(right):
            case, ask = divmod(i, 2)  # two items a case
            row = dict(length=100, seed=case, family="single", ask=ask, right=r, first=ask == 0)
            if guards is not None:
                row |= dict(density=0.2, guard=guards[case] if ask == 0 else None)
            out[(100, case, "single", ask)] = row
        return out

    dense = rows([True, True, True, True, True, False])
    # case 0 loses an item and its first sparse layer (4) reads 0.6; case 1 reads 0.9 there but 0.55 at a
    # later checked layer; case 2 gains one and reads 0.95 throughout
    guards = [{"4": 0.6, "8": 0.9}, {"4": 0.9, "8": 0.55}, {"4": 0.95, "8": 0.95}]
    sparse = rows([False, True, True, True, True, True], guards)
    low, mid, high = forced.guarded(dense, sparse, [0.5, 0.7, 0.96])
    assert (low["declined"], low["late"], low["density"]) == (0, 0, pytest.approx(0.2))
    assert (low["families"]["single"]["lost"], low["families"]["single"]["gained"]) == (1, 1)
    assert (mid["declined"], mid["late"], mid["rate"]) == (2, 1, pytest.approx(2 / 3))
    assert (mid["families"]["single"]["lost"], mid["families"]["single"]["gained"]) == (0, 1)
    assert mid["density"] == pytest.approx((1 + 1 + 0.2) / 3)
    assert (high["declined"], high["families"]["single"]["gained"]) == (3, 0)
    assert "| 0.7 | 2 of 3 (1) | 0.67 |" in forced.guard_report([mid])
    assert forced.choose_bound([low, mid, high]) == 0.5  # net 0 already: the fewest declines
    assert forced.choose_bound(forced.guarded(dense, rows([False] * 6, guards), [0.5, 0.7, 0.96])) == 0.96
    assert forced.choose_bound(forced.guarded(dense, rows([False] * 6, guards), [0.5])) is None
    with pytest.raises(ValueError, match="guard statistics"):
        forced.guarded(dense, rows([True] * 6, [None, None, None]), [0.5])
    with pytest.raises(ValueError, match="differ"):
        forced.guarded(dense, {k: v for k, v in sparse.items() if k[1] < 2}, [0.5])
