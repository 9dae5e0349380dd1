"""RULER-style retrieval items planted in real text: every task family's needles in one haystack, one question each.

A case is one haystack (real text of a corpus, `corpora.py`) carrying the needles of every family at random
line-aligned depths; each family asks one question at the end, and is scored by exact match on the answer's
first line. Families (after RULER, Hsieh et al. 2024):

- `single`: a number under a word-pair key (SINGLE_KEYS such needles, each asked on its own);
- `multikey`: MULTIKEY_KEYS access codes under near-identical keys (one character apart), every one asked;
- `multivalue`: four numbers under one key, all asked;
- `multiquery`: four keys, all four numbers asked;
- `vartrack`: a five-variable assignment chain beside a distractor chain, every variable holding the value asked;
- `commonwords`: `Tag:` lines, three tags five times each among fifteen once; the three most frequent asked;
- `passage`: no needle: a line of the haystack's own text (at least PASSAGE_MIN_CHARS, its first half found
  nowhere else in the context) is quoted up to its middle and its rest asked, a question on the real document.

The needles of different families never share a key word, a value or a surface form. Several questions of
one family in one case (`Question.ask`) share its haystack, so their answers are not independent.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
import string
from collections.abc import Callable

FAMILIES = ("single", "multikey", "multivalue", "multiquery", "vartrack", "commonwords", "passage")
SINGLE_KEYS = 3  # single needles per case, each asked on its own (the others are distinct-key distractors)
MULTIKEY_KEYS = 8  # near-identical keys per case, every one asked (one question each)
# the keys asked first, drawn at random (the draw every case has made since the suite began, so its needles,
# values and haystack stay the same); the others follow in key order
MULTIKEY_DRAWN = 2
PASSAGE_MIN_CHARS = 40  # a quoted line's length, stripped
PASSAGE_MAX_TOKENS = 40  # its rest's, so the answer fits the question's budget


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


ADJECTIVES = _words(
    "amber brave calm dusty eager faint gentle hollow icy jolly keen lively misty noble odd pale quiet rapid "
    "rusty silent tidy urban vivid wary young zesty bold crisp deep early fierce grand humble ivory lucky "
    "mellow narrow proud rough shiny tender upper velvet wild bright cosmic golden hidden lunar mossy polar "
    "royal scarlet solar stormy sunny swift woolly"
)
NOUNS = _words(
    "falcon harbor lantern meadow otter pepper quarry raven saddle tulip violin walnut anchor badger candle "
    "dagger ember fossil glacier hammer island jackal kettle ladder magnet needle orchard parrot quiver "
    "ribbon spider thistle umbrella vessel wagon yacht zebra acorn bison cactus dolphin eagle ferret garnet "
    "heron iguana juniper koala lemon mango nectar oyster panda quill rocket salmon tiger"
)


@dataclasses.dataclass(frozen=True)
class Question:
    family: str
    text: str
    answers: tuple[str, ...]  # all in the answer's first line (`single`, `multikey`: its first number)
    max_new_tokens: int
    ask: int = 0  # which of its family's questions in the case


@dataclasses.dataclass(frozen=True)
class Needle:
    family: str
    text: str
    depth: float  # the fraction of the haystack before it


@dataclasses.dataclass(frozen=True)
class Plan:
    needles: tuple[Needle, ...]
    questions: tuple[Question, ...]


def _number(rng: random.Random, used: set[str], digits: int = 7) -> str:
    while True:
        value = str(rng.randrange(10 ** (digits - 1), 10**digits))
        if value not in used:
            used.add(value)
            return value


def _key(rng: random.Random, used: set[str]) -> str:
    while True:
        adjective, noun = rng.choice(ADJECTIVES), rng.choice(NOUNS)
        if adjective not in used and noun not in used:
            used.update((adjective, noun))
            return f"{adjective}-{noun}"


def near_keys(rng: random.Random, count: int) -> list[str]:
    """`count` distinct keys of the form `ab-1234-c`, every one a single character away from the first."""
    base = "".join(rng.choices(string.ascii_lowercase, k=2)) + "-" + str(rng.randrange(1000, 10000))
    base += "-" + rng.choice(string.ascii_lowercase)
    keys = [base]
    slots = [i for i, c in enumerate(base) if c != "-"]
    while len(keys) < count:
        i = rng.choice(slots)
        pool = string.digits if base[i].isdigit() else string.ascii_lowercase
        key = base[:i] + rng.choice(pool.replace(base[i], "")) + base[i + 1 :]
        if key not in keys:
            keys.append(key)
    return keys


def _depths(rng: random.Random, count: int, ordered: bool = False) -> list[float]:
    depths = [rng.uniform(0.02, 0.98) for _ in range(count)]
    return sorted(depths) if ordered else depths


def plan_case(rng: random.Random) -> Plan:
    """Every family's needles and question for one haystack."""
    words: set[str] = set()
    values: set[str] = set()
    needles: list[Needle] = []
    questions: list[Question] = []

    for ask in range(SINGLE_KEYS):
        key = _key(rng, words)
        value = _number(rng, values)
        (depth,) = _depths(rng, 1)
        needles.append(Needle("single", f"The special magic number for {key} is: {value}.", depth))
        questions.append(
            Question(
                "single",
                f"What is the special magic number for {key} mentioned in the provided text?\n"
                f"Answer: The special magic number for {key} mentioned in the provided text is",
                (value,),
                12,
                ask,
            )
        )

    keys = near_keys(rng, MULTIKEY_KEYS)
    codes = [_number(rng, values) for _ in keys]
    for k, code, depth in zip(keys, codes, _depths(rng, len(keys)), strict=True):
        needles.append(Needle("multikey", f"The access code for {k} is: {code}.", depth))
    drawn = rng.sample(range(len(keys)), MULTIKEY_DRAWN)
    for ask, asked in enumerate([*drawn, *(i for i in range(len(keys)) if i not in drawn)]):
        questions.append(
            Question(
                "multikey",
                f"What is the access code for {keys[asked]} mentioned in the provided text?\n"
                f"Answer: The access code for {keys[asked]} mentioned in the provided text is",
                (codes[asked],),
                12,
                ask,
            )
        )

    key = _key(rng, words)
    many = [_number(rng, values) for _ in range(4)]
    for v, depth in zip(many, _depths(rng, 4), strict=True):
        needles.append(Needle("multivalue", f"One of the special magic values for {key} is: {v}.", depth))
    questions.append(
        Question(
            "multivalue",
            f"What are all the special magic values for {key} mentioned in the provided text?\n"
            f"Answer: The special magic values for {key} mentioned in the provided text are",
            tuple(many),
            48,
        )
    )

    keys = [_key(rng, words) for _ in range(4)]
    secrets = [_number(rng, values) for _ in keys]
    for k, v, depth in zip(keys, secrets, _depths(rng, 4), strict=True):
        needles.append(Needle("multiquery", f"The secret number for {k} is: {v}.", depth))
    listed = ", ".join(keys[:-1]) + f" and {keys[-1]}"
    questions.append(
        Question(
            "multiquery",
            f"What are the secret numbers for {listed} mentioned in the provided text?\n"
            f"Answer: The secret numbers for {listed} mentioned in the provided text are",
            tuple(secrets),
            48,
        )
    )

    names: list[str] = []
    while len(names) < 10:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    chains = names[:5], names[5:]
    start = [_number(rng, values, digits=5) for _ in chains]
    for chain, first in zip(chains, start, strict=True):
        for i, (name, depth) in enumerate(zip(chain, _depths(rng, len(chain), ordered=True), strict=True)):
            rhs = first if i == 0 else f"VAR {chain[i - 1]}"
            needles.append(Needle("vartrack", f"VAR {name} = {rhs}.", depth))
    questions.append(
        Question(
            "vartrack",
            f"Find all variables that are assigned the value {start[0]} in the text above.\n"
            f"Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
            f"assigned the value {start[0]}, they are:",
            chains[0],
            32,
        )
    )

    tags = rng.sample([n for n in NOUNS if n not in words], 18)
    frequent, rare = tags[:3], tags[3:]
    lines = [t for t in frequent for _ in range(5)] + rare
    for tag, depth in zip(lines, _depths(rng, len(lines)), strict=True):
        needles.append(Needle("commonwords", f"Tag: {tag}.", depth))
    questions.append(
        Question(
            "commonwords",
            "What are the 3 most frequent words in the lines that begin with 'Tag:' in the text above?\n"
            "Answer: The 3 most frequent tag words are:",
            tuple(frequent),
            24,
        )
    )
    return Plan(tuple(needles), tuple(questions))


@dataclasses.dataclass(frozen=True)
class Case:
    context: list[int]  # the haystack with every needle, shared by the questions' prompts
    questions: tuple[Question, ...]
    prompts: tuple[list[int], ...]  # context + each question, in `questions` order
    needle_at: tuple[tuple[str, int], ...]  # (needle text, its first token's position in `context`)
    passage_at: int  # the first token of the line `passage` asks about, in `context`


def line_starts(ids: list[int], ends_line: Callable[[int], bool]) -> list[int]:
    """Positions i where a line starts (i == 0 or token i - 1 ends a line)."""
    return [0] + [i + 1 for i, t in enumerate(ids[:-1]) if ends_line(t)]


def passage_question(
    context: list[int],
    starts: list[int],
    not_lines: set[int],
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    budget: int,
    rng: random.Random,
) -> tuple[Question, list[int], int]:
    """The `passage` question on a line of `context` (line starts `starts`, `not_lines` excluded: the
    needles), the one nearest a random depth whose question fits `budget` tokens; its token ids (as
    `build_case` appends a question); and that line's start."""
    text = decode(context)
    target = rng.uniform(0.02, 0.98) * len(context)
    ends = dict(itertools.pairwise([*starts, len(context)]))
    for start in sorted(starts, key=lambda s: abs(s - target)):
        if start in not_lines:
            continue
        line = decode(context[start : ends[start]]).strip()
        spaces = [i for i, c in enumerate(line) if c == " "]
        if len(line) < PASSAGE_MIN_CHARS or not spaces:
            continue
        cut = min(spaces, key=lambda i: abs(i - len(line) // 2))  # the space nearest the middle
        quote, rest = line[:cut].rstrip(), line[cut:].strip()
        if not quote or not rest or text.count(quote) != 1:
            continue
        needed = len(encode(rest))
        question = Question(
            "passage",
            f'Repeat the line of the text above that begins with "{quote}".\nAnswer: {quote}',
            (rest,),
            needed + 8,
        )
        ids = encode("\n\n" + question.text)
        if needed <= PASSAGE_MAX_TOKENS and len(ids) <= budget:
            return question, ids, start
    raise ValueError("tasks: no line of the haystack can be quoted for the passage question")


def build_case(
    haystack: list[int],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    ends_line: Callable[[int], bool],
    length: int,
    rng: random.Random,
) -> Case:
    """One case of at most `length` tokens per prompt: `haystack` (real text, at least `length` tokens) cut to
    fit, every needle of `plan_case` inserted at the line start nearest its depth, each question after it,
    the `passage` question last (on a line of the haystack, no longer than the longest planted question)."""
    plan = plan_case(rng)
    question_ids = [encode("\n\n" + q.text) for q in plan.questions]
    needle_ids = [encode(n.text + "\n") for n in plan.needles]
    body = length - max(map(len, question_ids)) - sum(map(len, needle_ids))
    if body <= 0 or len(haystack) < body:
        raise ValueError(f"tasks: {len(haystack)} haystack tokens cannot fill a {length}-token case")
    text = haystack[:body]
    starts = line_starts(text, ends_line)
    spots = []
    for needle in plan.needles:
        target = round(needle.depth * body)
        spots.append(min(starts, key=lambda s: abs(s - target)))
    order = sorted(range(len(plan.needles)), key=lambda i: (spots[i], i))  # a chain keeps its order
    context: list[int] = []
    placed: dict[int, int] = {}
    cut = 0
    for i in order:
        context += text[cut : spots[i]]
        cut = spots[i]
        placed[i] = len(context)
        context += needle_ids[i]
    context += text[cut:]
    budget = max(map(len, question_ids))
    passage, passage_ids, passage_at = passage_question(
        context, line_starts(context, ends_line), set(placed.values()), decode, encode, budget, rng
    )
    return Case(
        context=context,
        questions=(*plan.questions, passage),
        prompts=tuple(context + q for q in [*question_ids, passage_ids]),
        needle_at=tuple((plan.needles[i].text, placed[i]) for i in range(len(plan.needles))),
        passage_at=passage_at,
    )


def score(question: Question, answer: str) -> bool:
    """Exact match on the answer's first line: its first number for `single` / `multikey`, the line's rest
    (spaces aside) for `passage`, else every answer."""
    line = answer.strip().split("\n", 1)[0]
    if question.family == "passage":
        return line.split() == question.answers[0].split()
    if question.family in ("single", "multikey"):
        found = re.search(r"\d+", line)
        return found is not None and found.group() == question.answers[0]
    return all(re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", line) for a in question.answers)
