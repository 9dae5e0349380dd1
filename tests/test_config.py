"""The --prefill-ext-* options, parsed by a plain argparse parser (no SGLang needed)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sglang_prefill_ext.config import OPTIONS_DEST, PrefillExtConfig, add_cli_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(list(argv))


def test_no_flags_means_defaults() -> None:
    args = parse()
    assert args.enable_prefill_ext is False
    assert getattr(args, OPTIONS_DEST) is None
    assert PrefillExtConfig.from_options(None) == PrefillExtConfig()


def test_only_given_flags_are_stored() -> None:
    args = parse("--enable-prefill-ext", "--prefill-ext-eviction", "cost", "--prefill-ext-sparse")
    options = getattr(args, OPTIONS_DEST)
    assert options == {"eviction": "cost", "sparse": True}
    config = PrefillExtConfig.from_options(options)
    assert config.eviction == "cost" and config.sparse is True


@pytest.mark.parametrize(("text", "value"), [("true", True), ("off", False), ("1", True), ("no", False)])
def test_bool_flags_take_an_optional_value(text: str, value: bool) -> None:
    assert getattr(parse("--prefill-ext-sparse", text), OPTIONS_DEST) == {"sparse": value}


def test_every_field_has_a_flag_with_help() -> None:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    help_text = parser.format_help()
    for f in dataclasses.fields(PrefillExtConfig):
        assert f"--prefill-ext-{f.name.replace('_', '-')}" in help_text
        assert f.metadata["help"]


@pytest.mark.parametrize("argv", [["--prefill-ext-sparse", "maybe"], ["--prefill-ext-eviction", "random"]])
def test_bad_values_are_argparse_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


def test_unknown_or_invalid_options_refused() -> None:
    with pytest.raises(ValueError, match="unknown prefill-ext options: bogus"):
        PrefillExtConfig.from_options({"bogus": 1})
    with pytest.raises(ValueError, match="--prefill-ext-eviction='random'"):
        PrefillExtConfig.from_options({"eviction": "random"})
