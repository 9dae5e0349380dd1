"""`sglang-prefill-ext flags [--markdown]`: the `--prefill-ext-*` flags as `--help` states them.

One source: each flag's help and default come from `config.FLAGS` (the same text `add_cli_args` gives
SGLang's parser), the versions that serve it from the adapters' `PORTED_OPTIONS`, the refusals from
their `CONFLICTING_FLAGS`, the metrics from `runner.metrics.NAMES`. `--markdown` writes
`docs/FLAGS.md`, which `tests/test_flags_doc.py` holds equal to this output and to `--help`.
"""

from __future__ import annotations

import argparse

from sglang_prefill_ext import config
from sglang_prefill_ext.adapters import for_version
from sglang_prefill_ext.runner.metrics import NAMES as METRICS
from sglang_prefill_ext.versions import supported_versions

REGENERATE = "python -m sglang_prefill_ext.cli flags --markdown > docs/FLAGS.md"


def _versions(name: str | None) -> str:
    """The supported SGLang versions that serve flag `name` (None: the enable flag, every version;
    a version's PORTED_OPTIONS None: it serves every flag)."""
    served = []
    for version in supported_versions():
        ported = for_version(version, "hooks").PORTED_OPTIONS
        if name is None or ported is None or name in ported:
            served.append(version)
    return ", ".join(served)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows() -> list[tuple[str, str, str, str]]:
    """(flag, default, versions, help) per flag, in `--help`'s order."""
    enable = (config.ENABLE_FLAG, "off", _versions(None), config.ENABLE_HELP)
    return [enable] + [(f.option, f.shown_default, _versions(f.name), f.help) for f in config.FLAGS]


def plain() -> str:
    """One line per flag: the flag and its default."""
    table = rows()
    width = max(len(flag) for flag, _, _, _ in table)
    return "\n".join(f"{flag:<{width}}  {default}" for flag, default, _, _ in table)


def markdown() -> str:
    """docs/FLAGS.md."""
    refused = sorted(
        {why for v in supported_versions() for why in for_version(v, "hooks").CONFLICTING_FLAGS.values()}
    )
    lines = [
        "# Flags",
        "",
        f"Generated from `sglang_prefill_ext/config.py` by `{REGENERATE}`; do not edit by hand.",
        "",
        "```bash",
        "sglang serve --help | grep prefill-ext      # these flags (python -m sglang.launch_server takes the same)",
        "sglang serve --model-path ... --enable-prefill-ext [--prefill-ext-* ...]",
        "```",
        "",
        f"Every `--prefill-ext-*` flag needs `{config.ENABLE_FLAG}`; without it the flag is refused. "
        f"`{config.ENABLE_FLAG}` is refused with: {'; '.join(refused)}. A refused combination or a "
        "malformed value (not of the flag's type, not one of its choices, outside its range) stops the "
        "server before any model loads with one line, `error: <why>`, and exit status 1. A flag that a "
        "supported SGLang version does not serve is refused there by name.",
        "",
        '"what it does" is the flag\'s `--help` text; what each flag was measured to do is in '
        "[bench/RESULTS.md](../bench/RESULTS.md).",
        "",
        "| flag | default | SGLang | what it does |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{flag}` | {_cell(d)} | {v} | {_cell(h)} |" for flag, d, v, h in rows()]
    lines += [
        "",
        "With `--enable-metrics`, the runner adds these counters beside SGLang's own:",
        "",
    ]
    lines += [f"- `sglang:prefill_ext_{name}_total`: {text}" for name, text in METRICS.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sglang-prefill-ext flags", description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="docs/FLAGS.md: every flag with its help")
    print(markdown() if parser.parse_args(argv).markdown else plain() + "\n", end="")
    return 0
