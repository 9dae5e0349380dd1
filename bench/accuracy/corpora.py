"""Haystack text for the accuracy suites, from three corpora every host has offline, split dev / held-out.

- `stdlib-code`: the Python standard library's source (the text the sparse defaults were first tuned on);
- `package-code`: the installed `sglang` package's source, each file under a `# file: <path>` line;
- `prose`: English prose: the Python reference's topics (`pydoc_data.topics`), then the docstrings of the
  installed `transformers` package.

`SPLITS` says which corpora and seeds each split uses: defaults are chosen on `dev` and reported on
`heldout` (other corpora, other seeds) alone. Files are read in sorted order, so one host, one package
version and one tokenizer always give the same token stream; `fingerprint` names it in the results.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

# split -> (corpora, seed base): prompt i of a split draws from corpus i % len(corpora) with seed base + i
SPLITS: dict[str, tuple[tuple[str, ...], int]] = {
    "dev": (("stdlib-code",), 1000),
    "heldout": (("package-code", "prose"), 2000),
}
STDLIB_SKIP = ("test", "idlelib", "lib2to3", "pydoc_data", "site-packages", "turtledemo", "tkinter")


def _package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"corpora: the package {name!r} is not installed here")
    return Path(next(iter(spec.submodule_search_locations)))


def _sources(root: Path, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in skip:
            continue
        yield str(rel), path.read_text(encoding="utf-8", errors="replace")


def _stdlib_code() -> Iterator[str]:
    for _, text in _sources(Path(sysconfig.get_paths()["stdlib"]), STDLIB_SKIP):
        yield text


def _package_code() -> Iterator[str]:
    root = _package_root("sglang")
    for rel, text in _sources(root):
        yield f"# file: {root.name}/{rel}\n{text}"


def _docstrings(text: str) -> Iterator[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 200:
                yield doc


def _prose() -> Iterator[str]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key].strip()
    for _, text in _sources(_package_root("transformers")):
        yield from _docstrings(text)


CORPORA: dict[str, Callable[[], Iterator[str]]] = {
    "stdlib-code": _stdlib_code,
    "package-code": _package_code,
    "prose": _prose,
}


def corpus_text(name: str, min_chars: int) -> str:
    """At least `min_chars` characters of corpus `name` (whole documents, in their fixed order)."""
    parts: list[str] = []
    size = 0
    for text in CORPORA[name]():
        parts.append(text)
        size += len(text) + 2
        if size >= min_chars:
            return "\n\n".join(parts)
    raise RuntimeError(f"corpora: {name} holds only {size} characters here, {min_chars} asked")


def corpus_ids(name: str, encode: Callable[[str], list[int]], num_tokens: int) -> list[int]:
    """At least `num_tokens` token ids of corpus `name`."""
    chars = num_tokens * 5
    while True:
        ids = encode(corpus_text(name, chars))
        if len(ids) >= num_tokens:
            return ids
        chars *= 2


def fingerprint(ids: list[int]) -> str:
    """A short name for a token stream (same corpus files, same tokenizer: same fingerprint)."""
    return hashlib.sha256(b"".join(i.to_bytes(4, "little") for i in ids)).hexdigest()[:12]


def split_prompts(split: str, count: int) -> list[tuple[str, int]]:
    """(corpus, seed) of a split's first `count` prompts."""
    corpora, base = SPLITS[split]
    return [(corpora[i % len(corpora)], base + i) for i in range(count)]
