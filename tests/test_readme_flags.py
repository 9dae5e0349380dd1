"""README's flag table and `--help` list the same flags, each row matching its flag's `--help` entry.

The `--help` entries are read from the patched SGLang's own parser (`ServerArgs.add_cli_args`, the
parser `sglang serve` and `python -m sglang.launch_server` print): each one is `<help> (default: <D>)`,
both from `sglang_prefill_ext/config.py` (or, for `--prefill-ext-sparse-<field>`, SparseSettings'
field in `ops/settings.py`). README's `## Flags` table has one row per flag, `| flag | default |
what it does |`, in `--help`'s order, and for every row:

- the flag cell is the flag in backticks;
- the default cell, Markdown backticks dropped, is D, or D followed by a parenthesised remark
  (`0 (off)`);
- the "what it does" cell, Markdown backticks dropped, starts with <help> verbatim; what follows
  it is README's own (measured gains, sources, refusals).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FLAG = re.compile(r"--(?:enable-prefill-ext|prefill-ext-[a-z0-9-]+)")
HELP_ENTRY = re.compile(r"(?P<help>.*) \(default: (?P<default>[^()]*)\)", re.DOTALL)

pytestmark = pytest.mark.usefixtures("patched_sglang")


def readme_rows() -> list[tuple[str, str, str]]:
    """(flag, default, what it does) of each row of README's `## Flags` table, backticks dropped."""
    section = README.read_text(encoding="utf-8").split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            flag, default, does = (cell.replace("`", "") for cell in cells)
            rows.append((flag, default, does))
    return rows


@pytest.fixture(scope="module")
def help_entries() -> dict[str, tuple[str, str]]:
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


def test_readme_lists_the_flags_of_help_in_its_order(help_entries: dict[str, tuple[str, str]]) -> None:
    assert [flag for flag, _, _ in readme_rows()] == list(help_entries)


@pytest.mark.parametrize("row", readme_rows(), ids=lambda row: row[0])
def test_readme_row_matches_help(help_entries: dict[str, tuple[str, str]], row: tuple[str, str, str]) -> None:
    flag, default, does = row
    assert flag in help_entries, f"{flag} is in README's flag table, not in --help"
    help_text, shown_default = help_entries[flag]
    assert default == shown_default or default.startswith(f"{shown_default} ("), (
        flag,
        default,
        shown_default,
    )
    assert does.startswith(help_text), f"{flag}: README's cell must start with --help's text:\n{help_text}"


def test_sglang_serve_lists_the_flags() -> None:
    """`sglang serve`, the entry point SGLang recommends (and README's examples use), lists every flag
    of the table (an entry of `--help` starts two spaces in); run through this interpreter, whatever
    python the console script's shebang names."""
    sglang = Path(sys.executable).with_name("sglang")
    out = subprocess.run(
        [sys.executable, str(sglang), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    listed = re.findall(r"^  (--(?:enable-prefill-ext|prefill-ext-[a-z0-9-]+))\b", out, re.MULTILINE)
    assert listed == [flag for flag, _, _ in readme_rows()]
