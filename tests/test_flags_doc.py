"""docs/FLAGS.md is what `sglang-prefill-ext flags --markdown` prints, and lists the flags of `--help`.

The `--help` entries are read from the patched SGLang's own parser (`ServerArgs.add_cli_args`, the
parser `sglang serve` and `python -m sglang.launch_server` print): each one is `<help> (default: <D>)`.
Each row of the page's table, `| flag | default | SGLang | what it does |`, in `--help`'s order, has
the flag in backticks, D as its default and <help> as what it does (`|` escaped as `\\|`).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_prefill_ext import cli, flag_table

FLAGS_DOC = Path(__file__).resolve().parents[1] / "docs" / "FLAGS.md"
FLAG = re.compile(r"--(?:enable-prefill-ext|prefill-ext-[a-z0-9-]+)")
HELP_ENTRY = re.compile(r"(?P<help>.*) \(default: (?P<default>[^()]*)\)", re.DOTALL)


def doc_rows() -> list[tuple[str, str, str]]:
    """(flag, default, what it does) of each row of docs/FLAGS.md's table, escapes undone."""
    rows = []
    for line in FLAGS_DOC.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if line.startswith("| `") and len(cells) == 4:
            rows.append((cells[0].strip("`"), cells[1], cells[3]))
    return rows


def test_committed_page_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["flags", "--markdown"]) == 0
    assert capsys.readouterr().out == FLAGS_DOC.read_text(encoding="utf-8"), (
        f"docs/FLAGS.md is stale: {flag_table.REGENERATE}"
    )


def test_plain_listing_names_every_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["flags"]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert listed == [[flag, default] for flag, default, _ in doc_rows()]


@pytest.fixture(scope="module")
def help_entries(patched_sglang: object) -> dict[str, tuple[str, str]]:
    """Flag -> (help, default) as the patched SGLang's parser holds them, in `--help`'s order."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    entries = {}
    for action in parser._actions:
        for option in action.option_strings:
            if FLAG.fullmatch(option):
                entry = HELP_ENTRY.fullmatch(action.help)
                assert entry, (option, action.help)
                entries[option] = (entry["help"], entry["default"])
    return entries


def test_page_lists_the_flags_of_help_with_their_text(help_entries: dict[str, tuple[str, str]]) -> None:
    assert {flag: (does, default) for flag, default, does in doc_rows()} == help_entries
    assert [flag for flag, _, _ in doc_rows()] == list(help_entries)


@pytest.mark.usefixtures("patched_sglang")
def test_sglang_serve_lists_the_flags() -> None:
    """`sglang serve`, the entry point SGLang recommends, lists every flag of the page (an entry of
    `--help` starts two spaces in); run through this interpreter, whatever python the console
    script's shebang names."""
    sglang = Path(sys.executable).with_name("sglang")
    out = subprocess.run(
        [sys.executable, str(sglang), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    listed = re.findall(r"^  (--(?:enable-prefill-ext|prefill-ext-[a-z0-9-]+))\b", out, re.MULTILINE)
    assert listed == [flag for flag, _, _ in doc_rows()]
