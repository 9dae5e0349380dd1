"""bench.accuracy.tasks / ruler / corpora: the answer is in the prompt at its depth, distractors differ from
the key, the scoring is exact, and `compare` pairs prompts and tests them (McNemar) as stated."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.accuracy import corpora, ruler, tasks
from bench.lib.stats import mcnemar_exact

NEWLINE = ord("\n")


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def haystack(n: int) -> list[int]:
    """Lines of 49 characters, each its own: the passage question needs a quote found once."""
    lines = (encode(f"x = compute(value_{i:06d})  # a line of real code\n") for i in range(n // 49 + 1))
    return [t for line in lines for t in line][:n]


def family(case: tasks.Case, name: str) -> list[tasks.Question]:
    return [q for q in case.questions if q.family == name]


def make_case(length: int = 20_000, seed: int = 7) -> tasks.Case:
    return tasks.build_case(
        haystack(length), encode, decode, lambda t: t == NEWLINE, length, random.Random(seed)
    )


@pytest.mark.parametrize("seed", range(5))
def test_every_needle_sits_whole_at_a_line_start_near_its_depth(seed: int) -> None:
    rng = random.Random(seed)
    plan = tasks.plan_case(random.Random(seed))
    case = tasks.build_case(haystack(30_000), encode, decode, lambda t: t == NEWLINE, 30_000, rng)
    assert [text for text, _ in case.needle_at] == [n.text for n in plan.needles]
    inserted = sum(len(n.text) + 1 for n in plan.needles)
    body = len(case.context) - inserted
    for needle, (text, at) in zip(plan.needles, case.needle_at, strict=True):
        assert decode(case.context[at : at + len(text)]) == text
        assert at == 0 or case.context[at - 1] == NEWLINE
        before = sum(len(t) + 1 for t, a in case.needle_at if a < at)  # needles placed before it
        assert abs((at - before) / body - needle.depth) < 0.01  # the nearest line start: 49-char lines


def test_each_prompt_is_the_context_then_its_question_within_the_length() -> None:
    case = make_case()
    assert (
        len(case.prompts)
        == len(case.questions)
        == len(tasks.FAMILIES) + tasks.SINGLE_KEYS + tasks.MULTIKEY_KEYS - 2
    )
    assert [q.family for q in case.questions if q.ask == 0] == list(tasks.FAMILIES)
    assert max(map(len, case.prompts)) == 20_000
    for q, prompt in zip(case.questions, case.prompts, strict=True):
        assert prompt[: len(case.context)] == case.context
        assert decode(prompt[len(case.context) :]) == "\n\n" + q.text


def test_every_answer_is_planted_and_the_question_names_its_key() -> None:
    case = make_case()
    context = decode(case.context)
    for q in case.questions:
        for answer in q.answers:
            assert answer in context
    for q in family(case, "single"):
        key = q.text.split("number for ")[1].split(" mentioned")[0]
        assert f"The special magic number for {key} is: {q.answers[0]}." in context
    asked = [q.text.split("code for ")[1].split(" mentioned")[0] for q in family(case, "multikey")]
    assert len(set(asked)) == tasks.MULTIKEY_KEYS
    for key, q in zip(asked, family(case, "multikey"), strict=True):
        assert f"The access code for {key} is: {q.answers[0]}." in context


@pytest.mark.parametrize("seed", range(20))
def test_multikey_distractors_are_near_but_never_the_key(seed: int) -> None:
    keys = tasks.near_keys(random.Random(seed), 8)
    assert len(set(keys)) == 8
    for key in keys[1:]:
        assert len(key) == len(keys[0])
        assert sum(a != b for a, b in zip(key, keys[0], strict=True)) == 1


def test_the_vartrack_chain_is_in_order_and_commonwords_counts_hold() -> None:
    case = make_case(seed=3)
    (vt,) = family(case, "vartrack")
    at = dict(case.needle_at)
    chain = list(vt.answers)
    value = vt.text.split("value ")[1].split(" ")[0]
    hops = [at[f"VAR {b} = VAR {a}."] for a, b in zip(chain, chain[1:], strict=False)]
    assert at[f"VAR {chain[0]} = {value}."] < hops[0]
    assert hops == sorted(hops)
    (cw,) = family(case, "commonwords")
    tags = [t.removeprefix("Tag: ").rstrip(".") for t, _ in case.needle_at if t.startswith("Tag: ")]
    counts = {t: tags.count(t) for t in set(tags)}
    assert all(counts[w] == 5 for w in cw.answers)
    assert all(c == 1 for t, c in counts.items() if t not in cw.answers)


def test_keys_values_and_words_never_repeat_across_families() -> None:
    plan = tasks.plan_case(random.Random(11))
    values = [n.text.rsplit(": ", 1)[1].rstrip(".") for n in plan.needles if ": " in n.text]
    numbers = [v for v in values if v.isdigit()]
    assert len(numbers) == len(set(numbers))


def test_too_little_text_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot fill"):
        tasks.build_case(haystack(500), encode, decode, lambda t: t == NEWLINE, 20_000, random.Random(0))


@pytest.mark.parametrize(
    "family, answers, answer, right",
    [
        ("single", ("1234567",), " 1234567.\nThe special", True),
        ("single", ("1234567",), " 1234568. 1234567", False),  # the first number decides
        ("multikey", ("7654321",), " 7654321", True),
        ("multikey", ("7654321",), "\n\n 7654321.", True),
        ("multikey", ("7654321",), " unknown\n7654321", False),  # only the first line
        ("multivalue", ("1111111", "2222222"), " 2222222, 1111111.", True),
        ("multivalue", ("1111111", "2222222"), " 2222222, 11111110.", False),  # a whole number only
        ("vartrack", ("ABCDE", "FGHIJ"), " ABCDE, FGHIJ", True),
        ("vartrack", ("ABCDE", "FGHIJ"), " ABCDE, FGHIJK", False),
        ("commonwords", ("otter", "tulip", "raven"), " otter, tulip and raven.", True),
    ],
)
def test_score_is_exact_on_the_first_line(family: str, answers: tuple, answer: str, right: bool) -> None:
    assert tasks.score(tasks.Question(family, "", answers, 8), answer) is right


def test_mcnemar_exact_matches_the_binomial_test() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(4, 1) == mcnemar_exact(1, 4) == pytest.approx(2 * 6 / 32)
    assert mcnemar_exact(3, 3) == 1.0


def test_splits_use_disjoint_corpora_and_seeds() -> None:
    dev, held = corpora.split_prompts("dev", 40), corpora.split_prompts("heldout", 40)
    assert not {c for c, _ in dev} & {c for c, _ in held}
    assert not {s for _, s in dev} & {s for _, s in held}
    assert {c for c, _ in held} == {"package-code", "prose"}


@pytest.mark.parametrize("name", sorted(corpora.CORPORA))
def test_each_corpus_gives_fixed_text(name: str) -> None:
    text = corpora.corpus_text(name, 200_000)
    assert len(text) >= 200_000
    assert text == corpora.corpus_text(name, 200_000)


def _rows(path: Path, rights: list[bool], family: str = "multikey", ttft: float = 1.0) -> str:
    rows = [
        dict(
            length=1000,
            seed=i,
            family=family,
            cold=True,
            prompt_sha=f"p{i}",
            right=r,
            ttft_s=ttft,
        )
        for i, r in enumerate(rights)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_compare_counts_lost_gained_and_fails_a_cell_that_loses(tmp_path: Path) -> None:
    dense = ruler.load(_rows(tmp_path / "d.jsonl", [True] * 8 + [False] * 2, ttft=2.0))
    sparse = ruler.load(_rows(tmp_path / "s.jsonl", [True] * 7 + [False, True, False], ttft=1.0))
    out = ruler.compare(dense, sparse)
    c = out["cells"]["multikey@1000"]
    assert (c["dense"], c["other"], c["lost"], c["gained"]) == (8, 8, 1, 1)
    assert c["keep"] == 1.0 and c["p"] == 1.0 and out["pass"]
    assert out["lengths"][1000]["ttft_ratio"] == 2.0
    worse = ruler.load(_rows(tmp_path / "w.jsonl", [True] * 7 + [False] * 3))
    assert not ruler.compare(dense, worse)["pass"]  # keeps 7/8 < 99 %


def test_a_cell_dense_fails_does_not_count(tmp_path: Path) -> None:
    dense = ruler.load(_rows(tmp_path / "d.jsonl", [True] * 4 + [False] * 6))
    sparse = ruler.load(_rows(tmp_path / "s.jsonl", [False] * 10))
    out = ruler.compare(dense, sparse)
    assert not out["cells"]["multikey@1000"]["counts"] and out["pass"]


def test_compare_refuses_files_of_other_prompts(tmp_path: Path) -> None:
    dense = ruler.load(_rows(tmp_path / "d.jsonl", [True] * 3))
    other = ruler.load(_rows(tmp_path / "o.jsonl", [True] * 3))
    other[(1000, 1, "multikey", 0)]["prompt_sha"] = "x"
    with pytest.raises(SystemExit, match="differs"):
        ruler.compare(dense, other)


def test_choose_takes_the_fastest_passing_run_else_the_one_losing_least(tmp_path: Path) -> None:
    dense = ruler.load(_rows(tmp_path / "d.jsonl", [True] * 10, ttft=3.0))
    runs = {
        "slow_ok": ruler.load(_rows(tmp_path / "a.jsonl", [True] * 10, ttft=2.0)),
        "fast_ok": ruler.load(_rows(tmp_path / "b.jsonl", [True] * 10, ttft=1.0)),
        "fastest_lossy": ruler.load(_rows(tmp_path / "c.jsonl", [True] * 8 + [False] * 2, ttft=0.5)),
    }
    results = {name: ruler.compare(dense, rows) for name, rows in runs.items()}
    assert ruler.choose(results) == "fast_ok"
    del results["fast_ok"], results["slow_ok"]
    results["lossier"] = ruler.compare(dense, ruler.load(_rows(tmp_path / "e.jsonl", [False] * 10, ttft=0.1)))
    assert ruler.choose(results) == "fastest_lossy"


@pytest.mark.parametrize("seed", range(4))
def test_the_passage_question_quotes_a_haystack_line_found_once_and_asks_its_rest(seed: int) -> None:
    case = make_case(seed=seed)
    (q,) = family(case, "passage")
    context = decode(case.context)
    at = case.passage_at
    assert at == 0 or case.context[at - 1] == NEWLINE
    assert at not in {a for _, a in case.needle_at}
    line = decode(case.context[at:]).split("\n", 1)[0].strip()
    quote = q.text.split('begins with "', 1)[1].split('".\n', 1)[0]
    assert context.count(quote) == 1 and line.startswith(quote) and len(line) >= tasks.PASSAGE_MIN_CHARS
    assert line[len(quote) :].split() == q.answers[0].split()
    assert q.text.endswith(f"Answer: {quote}")  # the model goes on with the line's rest
    assert 0.01 < at / len(case.context) < 0.99
    assert len(case.prompts[case.questions.index(q)]) <= 20_000


def test_passage_scoring_takes_the_rest_of_the_line_spaces_aside() -> None:
    q = tasks.Question("passage", "", ("# a line of real code",), 16)
    assert tasks.score(q, " # a line of real code\nx = compute(value_000002)")
    assert tasks.score(q, "  #  a line of  real code ")
    assert not tasks.score(q, " # a line of real")
    assert not tasks.score(q, " # a line of real code, and more")
    assert not tasks.score(q, " # a line of\nreal code")  # the rest on the answer's first line


def test_a_haystack_with_no_line_found_once_cannot_be_quoted() -> None:
    line = encode("x = compute(value)  # the same line of code, again and again\n")
    hay = (line * 1000)[:20_000]
    with pytest.raises(ValueError, match="no line of the haystack can be quoted"):
        tasks.build_case(hay, encode, decode, lambda t: t == NEWLINE, 20_000, random.Random(0))
