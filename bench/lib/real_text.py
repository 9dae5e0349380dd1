"""Real text for the real-weights checks (SmolLM2): the Python standard library's own source files.

No dataset ships offline; every host has the standard library, and code plus docstrings is natural
enough text for greedy decoding and attention structure. Files are read in a fixed order, so one
host and one tokenizer always give the same token stream.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

MODULES = (
    "argparse.py",
    "textwrap.py",
    "difflib.py",
    "pathlib/__init__.py",
    "pathlib.py",
    "inspect.py",
    "json/decoder.py",
    "json/encoder.py",
    "email/message.py",
    "http/client.py",
    "logging/__init__.py",
    "collections/__init__.py",
    "typing.py",
    "dataclasses.py",
    "enum.py",
    "functools.py",
    "statistics.py",
)


def corpus_text(min_chars: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for name in MODULES:
        path = root / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            parts.append(text)
            size += len(text)
        if size >= min_chars:
            break
    if size < min_chars:
        raise RuntimeError(f"the standard library under {root} gave only {size} characters")
    return "\n\n".join(parts)


def corpus_ids(tokenizer, num_tokens: int) -> list[int]:
    """At least `num_tokens` token ids of standard-library source, tokenized without special tokens."""
    chars = num_tokens * 5
    while True:
        ids = tokenizer(corpus_text(chars), add_special_tokens=False)["input_ids"]
        if len(ids) >= num_tokens:
            return ids
        chars *= 2
