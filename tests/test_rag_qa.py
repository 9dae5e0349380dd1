"""The blend suite's multi-document QA items (bench.accuracy.rag_qa), over real standard-library lines and
a byte-level tokenizer: the answer sits in the chunk the item names, and the distractors differ from it."""

from __future__ import annotations

import random
import re

import pytest

from bench.accuracy import rag_qa
from bench.accuracy.ruler_forced import answer_ids


def encode(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return rag_qa.corpus_lines("stdlib-code", 300_000)


def chunk_texts(item: rag_qa.Item) -> list[str]:
    return [bytes(item.ids[s:e]).decode() for s, e in item.spans]


def items(family: str, lines: list[str], count: int = 12) -> list[rag_qa.Item]:
    return [rag_qa.build_item(family, lines, encode, random.Random(i), 6, 200, 400) for i in range(count)]


def test_the_prompt_is_header_documents_question(lines: list[str]) -> None:
    for item in items("single", lines, 3):
        text = bytes(item.ids).decode()
        assert text.startswith(rag_qa.HEADER) and item.header_len == len(encode(rag_qa.HEADER))
        assert text.endswith("\n\n" + item.question.text)
        ends = [item.header_len] + [e for _, e in item.spans]
        for i, ((start, end), previous) in enumerate(zip(item.spans, ends, strict=False)):
            assert bytes(item.ids[previous:start]).decode() == f"\nDocument {i + 1}:\n"  # glue, outside spans
            assert end - start >= 200  # a document is whole lines of at least its drawn length
        assert item.ids[item.spans[-1][1] :] == encode("\n\n" + item.question.text)


def test_a_single_answer_sits_in_its_chunk_alone(lines: list[str]) -> None:
    for item in items("single", lines):
        (where,), (fact,) = item.answer_chunks, item.facts
        texts = chunk_texts(item)
        value = item.question.answers[0]
        key = re.search(r"number for (\S+) mentioned", item.question.text).group(1)
        assert fact == f"The special magic number for {key} is: {value}." and fact in texts[where]
        assert [value in t for t in texts] == [i == where for i in range(len(texts))]
        assert [key in t for t in texts] == [i == where for i in range(len(texts))]
        distractors = [
            re.findall(r"magic number for (\S+) is: (\d+)\.", t) for i, t in enumerate(texts) if i != where
        ]
        assert all(len(d) == 1 for d in distractors)
        keys, values = zip(*(d[0] for d in distractors), strict=True)
        assert len(set(keys) | {key}) == len(texts) and len(set(values) | {value}) == len(texts)


def test_a_multihop_answer_needs_two_chunks(lines: list[str]) -> None:
    orders = set()
    for item in items("multihop", lines):
        (courier, locker), (link, fact) = item.answer_chunks, item.facts
        texts = chunk_texts(item)
        key = re.search(r"courier for (\S+) mentioned", item.question.text).group(1)
        name = re.fullmatch(rf"The courier for {key} is (\w+ \w+)\.", link).group(1)
        value = item.question.answers[0]
        assert courier != locker and link in texts[courier] and fact in texts[locker]
        assert fact == f"The locker number of {name} is: {value}."
        assert [key in t for t in texts] == [i == courier for i in range(len(texts))]
        assert [value in t for t in texts] == [i == locker for i in range(len(texts))]
        links = [m for t in texts for m in re.findall(r"The courier for (\S+) is (\w+ \w+)\.", t)]
        numbers = dict(m for t in texts for m in re.findall(r"The locker number of (\w+ \w+) is: (\d+)\.", t))
        assert len(links) >= 2 and len({k for k, _ in links}) == len(links)  # distractor chains, other keys
        assert {n for _, n in links} == set(numbers) and len(set(numbers.values())) == len(numbers)
        orders.add(courier < locker)
    assert orders == {True, False}  # the link comes before the answer's chunk and after it


def test_items_of_a_split_are_reproducible_and_take_turns_over_its_corpora() -> None:
    def draw() -> list[tuple[dict[str, object], rag_qa.Item]]:
        return rag_qa.items_of("dev", ["single", "multihop"], 2, encode, 3, 100, 150, corpus_chars=200_000)

    first, second = draw(), draw()
    assert [f for f, _ in first] == [f for f, _ in second]
    assert [i.ids for _, i in first] == [i.ids for _, i in second]
    assert [(f["family"], f["index"]) for f, _ in first] == [
        ("single", 0),
        ("single", 1),
        ("multihop", 0),
        ("multihop", 1),
    ]
    assert len({tuple(i.ids) for _, i in first}) == 4


@pytest.mark.parametrize("family", rag_qa.FAMILIES)
def test_the_answer_line_ends_as_its_fact_does_before_the_value(family: str, lines: list[str]) -> None:
    """The forced answer is the value alone: the answer line ends with the words that precede the value in
    the fact ("... is:"), so the fact's punctuation is not left for the model to copy first. Ending it one
    word short ("... is") made ':' a rival of the answer's first token, a formatting coin that decided
    every single-family item under blending (0 of 23 right, each with the value's digits right)."""
    for item in items(family, lines, 4):
        value = item.question.answers[0]
        tail = item.question.text.rsplit(" ", 1)[-1]
        assert tail == rag_qa.LEAD and f" {tail} {value}." in item.facts[-1]
        asked, answer = answer_ids(encode, item.question)
        assert bytes(answer).decode() == f" {value}"
