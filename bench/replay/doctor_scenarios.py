"""The traffic patterns the cache doctor was not tuned on (issue 41), each as (planted, fixed) prompts
where a layout fix applies: the same requests, and the same requests laid out as the fix says."""

from __future__ import annotations

import random

from bench.replay.doctor_traffic import Prompt, tokens


def rag_subsets(
    n: int = 120, chunks: int = 20, take: int = 6, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """(planted, fixed): a system prompt, `take` of `chunks` retrieved chunks in relevance order, a
    question; fixed: each request's chunks in the order they were first seen."""
    rng = random.Random(seed)
    system = ("system", tokens(rng, 1000))
    pool = [(f"c{c}", tokens(rng, rng.randint(800, 2000))) for c in range(chunks)]
    picks = [rng.sample(range(chunks), take) for _ in range(n)]
    first: dict[int, tuple[int, int]] = {}
    for i, pick in enumerate(picks):
        for position, c in enumerate(pick):
            first.setdefault(c, (i, position))
    planted, fixed = [], []
    for i, pick in enumerate(picks):
        question = (f"q{i}", tokens(rng, 100))
        planted.append(Prompt(f"r{i}", [system, *(pool[c] for c in pick), question]))
        fixed.append(
            Prompt(f"r{i}", [system, *(pool[c] for c in sorted(pick, key=first.__getitem__)), question])
        )
    return planted, fixed


def stanzas(
    n: int = 40, count: int = 60, edit_at: int = 20, seed: int = 1
) -> tuple[list[Prompt], list[Prompt]]:
    """(planted, fixed): a document of `count` 300-token stanzas that repeat their boilerplate (the
    services of a compose file), a question; from request `edit_at` on, 20 tokens of stanza 30 differ.
    Fixed: stanza 30 after the rest of the document."""
    rng = random.Random(seed)
    boiler = tokens(rng, 292)
    body = [(f"s{i}", tokens(rng, 8) + boiler) for i in range(count)]
    edited = ("s30'", body[30][1][:100] + tokens(rng, 20) + body[30][1][120:])
    planted, fixed = [], []
    for i in range(n):
        stanza = edited if i >= edit_at else body[30]
        question = (f"q{i}", tokens(rng, 120))
        planted.append(Prompt(f"r{i}", [*body[:30], stanza, *body[31:], question]))
        fixed.append(Prompt(f"r{i}", [*body[:30], *body[31:], stanza, question]))
    return planted, fixed


def profiles(n: int = 60, seed: int = 2) -> tuple[list[Prompt], list[Prompt]]:
    """(planted, fixed): a system prompt, a per-request profile of 176-763 tokens, a shared 20K-token
    document, a question; fixed: the profile after the document."""
    rng = random.Random(seed)
    system, doc = ("system", tokens(rng, 3000)), ("doc", tokens(rng, 20000))
    planted, fixed = [], []
    for i in range(n):
        profile, question = (f"p{i}", tokens(rng, rng.randint(176, 763))), (f"q{i}", tokens(rng, 100))
        planted.append(Prompt(f"r{i}", [system, profile, doc, question]))
        fixed.append(Prompt(f"r{i}", [system, doc, profile, question]))
    return planted, fixed


def agents(sessions: int = 12, turns: int = 6, files: int = 16, seed: int = 3) -> list[Prompt]:
    """Agents' conversations, one turn each in round robin: a shared system prompt and a task, then
    turns appending an answer, a file read from a shared pool (the tool's output) and a user line."""
    rng = random.Random(seed)
    system = ("system", tokens(rng, 2000))
    pool = [(f"f{f}", tokens(rng, rng.randint(600, 2000))) for f in range(files)]
    history = [[system, (f"task{s}", tokens(rng, 150))] for s in range(sessions)]
    prompts = []
    for turn in range(turns):
        for s in range(sessions):
            if turn:
                name = f"s{s}t{turn}"
                history[s] += [
                    (f"{name}a", tokens(rng, rng.randint(50, 200))),
                    rng.choice(pool),
                    (f"{name}u", tokens(rng, 30)),
                ]
            prompts.append(Prompt(f"s{s}t{turn}", list(history[s])))
    return prompts


def clean(seed: int = 4) -> list[Prompt]:
    """Shared documents with questions after them, append-only conversations, a session id at the end."""
    rng = random.Random(seed)
    docs = [(f"d{d}", tokens(rng, 6000)) for d in range(3)]
    prompts = [Prompt(f"q{i}", [docs[i % 3], (f"q{i}", tokens(rng, 200))]) for i in range(12)]
    conversation = [("system", tokens(rng, 1500))]
    for turn in range(6):
        conversation += [(f"t{turn}", tokens(rng, 300))]
        prompts.append(Prompt(f"c{turn}", [*conversation, (f"id{turn}", tokens(rng, 12))]))
        conversation += [(f"id{turn}", [])]
    return prompts
