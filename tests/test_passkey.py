"""bench.accuracy.passkey: where the needle lands, and the dense-vs-sparse verdict of `compare`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.accuracy import passkey


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_prompt_has_the_length_the_needle_at_its_depth_and_ends_with_the_question(depth: float) -> None:
    text = list(range(1000, 3000))
    ids = passkey.build_prompt(text, encode, 1200, depth, "12345")
    needle, question = encode(passkey.NEEDLE.format(key="12345")), encode(passkey.QUESTION)
    body = 1200 - len(needle) - len(question)
    at = round(body * depth)
    assert len(ids) == 1200
    assert ids[at : at + len(needle)] == needle
    assert ids[-len(question) :] == question
    assert ids[:at] + ids[at + len(needle) : -len(question)] == text[:body]


def test_too_little_text_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot fill"):
        passkey.build_prompt(list(range(100)), encode, 1200, 0.5, "12345")


def test_keys_are_five_digits_and_fixed() -> None:
    cases = passkey.prompt_keys([0.1, 0.9], 3)
    assert cases == passkey.prompt_keys([0.1, 0.9], 3)
    assert [d for d, _ in cases] == [0.1] * 3 + [0.9] * 3
    assert all(len(key) == 5 and key.isdigit() for _, key in cases)


def _write(path: Path, rights: list[bool], ttft: float | None = None) -> str:
    rows = [
        dict(
            idx=i,
            length=1200,
            depth=0.5 if i % 2 else 0.1,
            right=r,
            answer=" 12345" if r else " no",
            ttft_s=ttft,
        )
        for i, r in enumerate(rights)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_compare_fails_only_when_sparse_misses_what_dense_answers(tmp_path: Path, monkeypatch) -> None:
    dense = _write(tmp_path / "dense.jsonl", [True, False, True, True])
    same_or_better = _write(tmp_path / "a.jsonl", [True, True, True, True])
    worse = _write(tmp_path / "b.jsonl", [True, False, False, True])

    def compare(*files: str) -> int:
        monkeypatch.setattr(
            sys, "argv", ["passkey.py", "compare", *files, "--json", str(tmp_path / "s.json")]
        )
        return passkey.main()

    assert compare(dense, same_or_better) == 0
    assert compare(dense, worse) == 1
    assert json.loads((tmp_path / "s.json").read_text())[worse]["1200"]["missed"] == [2]


def test_compare_counts_equal_answers_and_the_ttft_ratio(tmp_path: Path, monkeypatch, capsys) -> None:
    dense = _write(tmp_path / "dense.jsonl", [True, False, True, True], ttft=0.6)
    sparse = _write(tmp_path / "sparse.jsonl", [True, True, True, True], ttft=0.2)
    reference = _write(tmp_path / "hf.jsonl", [True, False, True, True])
    monkeypatch.setattr(
        sys, "argv", ["passkey.py", "compare", dense, sparse, reference, "--json", str(tmp_path / "s.json")]
    )
    assert passkey.main() == 0
    summary = {path: rows["1200"] for path, rows in json.loads((tmp_path / "s.json").read_text()).items()}
    assert summary[sparse]["same_answers"] == 3 and summary[reference]["same_answers"] == 4
    assert summary[dense]["ttft_p50_s"] == 0.6 and summary[reference]["ttft_p50_s"] is None
    out = capsys.readouterr().out
    assert "TTFT 3.00x lower" in out
    # dense answers 3 of 4 (< DENSE_FLOOR): the length is reported as not counting
    assert "dense fails at this length, the row does not count" in out and not summary[sparse]["counts"]


def test_a_constant_is_planted_as_code_and_asked_back_by_name() -> None:
    text = list(range(1000, 3000))
    ids = passkey.build_prompt(text, encode, 1500, 0.5, "40213", kind="constant")
    decoded = "".join(chr(i) for i in ids if i < 1000)
    assert "RETRY_BUDGET_EACBD = 40213" in decoded
    assert decoded.endswith("set to above?\n# Answer: RETRY_BUDGET_EACBD =") and len(ids) == 1500
