"""Multi-document QA items for the blend accuracy suite: k documents of real text, a fact planted in them.

An item is a RAG prompt: a header, then `chunks` documents (each `Document i:` line is glue, computed;
each document's text is a chunk span, tokenized on its own as a blending client tokenizes it), then
the question. Families:

- `single`: the answer sits in one chunk (`answer_chunks`): "The special magic number for KEY is:
  VALUE." Every other chunk holds the same sentence for another key and another value.
- `multihop`: two chunks are needed: one says who the courier for KEY is (a person), another gives
  that person's locker number (the answer). Distractor chains of other keys, couriers and numbers
  lie in the same documents, so neither fact answers alone.

Keys, names and values never repeat within an item. Documents come from the split's corpora
(`corpora.SPLITS`: dev = standard-library source, held-out = the sglang package's source and English
prose), as whole lines from a random place, between `min_tokens` and `max_tokens` long; a fact goes
in at a random line start of its document.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from bench.accuracy import corpora, tasks

FAMILIES = ("single", "multihop")
HEADER = "Answer the question using the documents below.\n"
LEAD = "is:"  # the words before a value, in its fact and at the end of the question's answer line
FIRST_NAMES = tuple(
    [
        "Alma",
        "Bruno",
        "Celia",
        "Dario",
        "Edith",
        "Felix",
        "Greta",
        "Hugo",
        "Irene",
        "Jonas",
        "Katya",
        "Leon",
        "Mira",
        "Nils",
        "Olga",
        "Pavel",
    ]
)
LAST_NAMES = tuple(
    [
        "Abbott",
        "Brandt",
        "Castro",
        "Dalton",
        "Ekman",
        "Fischer",
        "Gallo",
        "Holm",
        "Ibsen",
        "Jansen",
        "Kovac",
        "Lund",
        "Moreau",
        "Novak",
    ]
)
Encode = Callable[[str], list[int]]
Planted = tuple[list[list[str]], tuple[int, ...], tuple[str, ...], tasks.Question]


@dataclasses.dataclass(frozen=True)
class Item:
    family: str
    ids: list[int]  # header, glue and chunks, then the question (no answer)
    header_len: int  # the header's tokens: the system prompt a chunk is first cached after
    spans: tuple[tuple[int, int], ...]  # each chunk's [start, end) in `ids`
    answer_chunks: tuple[int, ...]  # the chunks holding the facts the answer needs, in the order used
    facts: tuple[str, ...]  # those facts' sentences, in the same order
    question: tasks.Question


class _Fresh:
    """Values, keys and names not used before in this item."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _new(self, make: Callable[[], str]) -> str:
        while (value := make()) in self.used:
            pass
        self.used.add(value)
        return value

    def number(self) -> str:
        return self._new(lambda: str(self.rng.randrange(1_000_000, 10_000_000)))

    def key(self) -> str:
        return self._new(lambda: f"{self.rng.choice(tasks.ADJECTIVES)}-{self.rng.choice(tasks.NOUNS)}")

    def name(self) -> str:
        return self._new(lambda: f"{self.rng.choice(FIRST_NAMES)} {self.rng.choice(LAST_NAMES)}")


def _single(fresh: _Fresh, chunks: int) -> Planted:
    keys = [(fresh.key(), fresh.number()) for _ in range(chunks)]
    planted = [[f"The special magic number for {key} {LEAD} {value}."] for key, value in keys]
    where = fresh.rng.randrange(chunks)
    key, value = keys[where]
    question = tasks.Question(
        "single",
        f"What is the special magic number for {key} mentioned in the provided documents?\n"
        f"Answer: The special magic number for {key} mentioned in the provided documents {LEAD}",
        (value,),
        12,
    )
    return planted, (where,), (planted[where][0],), question


def _multihop(fresh: _Fresh, chunks: int) -> Planted:
    planted: list[list[str]] = [[] for _ in range(chunks)]
    chains = []
    for _ in range(max(2, chunks // 2)):
        key, name, value = fresh.key(), fresh.name(), fresh.number()
        courier, locker = fresh.rng.sample(range(chunks), 2)
        link = f"The courier for {key} is {name}."
        answer = f"The locker number of {name} {LEAD} {value}."
        planted[courier].append(link)
        planted[locker].append(answer)
        chains.append((key, value, (courier, locker), (link, answer)))
    key, value, where, facts = chains[0]
    question = tasks.Question(
        "multihop",
        f"What is the locker number of the courier for {key} mentioned in the provided documents?\n"
        f"Answer: The locker number of the courier for {key} mentioned in the provided documents {LEAD}",
        (value,),
        12,
    )
    return planted, where, facts, question


PLANTERS = {"single": _single, "multihop": _multihop}


def _document(lines: list[str], encode: Encode, rng: random.Random, tokens: int) -> list[str]:
    """Whole lines from a random place, about `tokens` long (at least one line)."""
    start = rng.randrange(len(lines))
    out: list[str] = []
    size = 0
    for line in lines[start:] + lines[:start]:
        out.append(line)
        size += len(encode(line))
        if size >= tokens:
            break
    return out


def build_item(
    family: str,
    lines: list[str],
    encode: Encode,
    rng: random.Random,
    chunks: int = 8,
    min_tokens: int = 512,
    max_tokens: int = 2048,
) -> Item:
    """One item of `family` from corpus `lines` (each ending in a newline)."""
    planted, where, facts, question = PLANTERS[family](_Fresh(rng), chunks)
    ids = encode(HEADER)
    header_len = len(ids)
    spans = []
    for i, sentences in enumerate(planted):
        doc = _document(lines, encode, rng, rng.randint(min_tokens, max_tokens))
        for sentence in sentences:
            doc.insert(rng.randrange(len(doc) + 1), sentence + "\n")
        ids += encode(f"\nDocument {i + 1}:\n")
        chunk = encode("".join(doc))
        spans.append((len(ids), len(ids) + len(chunk)))
        ids += chunk
    ids += encode("\n\n" + question.text)
    return Item(family, ids, header_len, tuple(spans), where, facts, question)


def corpus_lines(corpus: str, min_chars: int) -> list[str]:
    """The corpus's first `min_chars` characters or more, as non-blank lines ending in a newline."""
    text = corpora.corpus_text(corpus, min_chars)
    return [line + "\n" for line in text.splitlines() if line.strip()]


def items_of(
    split: str,
    families: list[str],
    count: int,
    encode: Encode,
    chunks: int = 8,
    min_tokens: int = 512,
    max_tokens: int = 2048,
    corpus_chars: int = 2_000_000,
) -> list[tuple[dict[str, object], Item]]:
    """(row fields, item) for `count` items of each family, drawn as `corpora.split_prompts` says."""
    lines: dict[str, list[str]] = {}
    out = []
    for family in families:
        for index, (corpus, seed) in enumerate(corpora.split_prompts(split, count)):
            if corpus not in lines:
                lines[corpus] = corpus_lines(corpus, corpus_chars)
            rng = random.Random(f"{seed}:{family}")
            item = build_item(family, lines[corpus], encode, rng, chunks, min_tokens, max_tokens)
            out.append((dict(split=split, corpus=corpus, seed=seed, index=index, family=family), item))
    return out
