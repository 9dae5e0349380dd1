"""The --prefill-ext-* options, parsed by a plain argparse parser (no SGLang needed but for the
accessor, on SGLang's own ServerArgs)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from types import ModuleType

import pytest

from sglang_prefill_ext.adapters.common import prefill_ext_config
from sglang_prefill_ext.config import (
    FLAGS,
    FLAGS_BY_NAME,
    OPTIONS_DEST,
    OptionError,
    PrefillExtConfig,
    add_cli_args,
)
from sglang_prefill_ext.ops.settings import SparseSettings
from sglang_prefill_ext.runner.pass_cost import PassCost


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
    names = {f.name for f in dataclasses.fields(PrefillExtConfig)} - {"sparse_settings"}
    names |= {f"sparse_{f.name}" for f in dataclasses.fields(SparseSettings)}
    assert {flag.name for flag in FLAGS} == names
    for flag in FLAGS:
        assert f"--prefill-ext-{flag.name.replace('_', '-')}" in help_text
        assert flag.help


def test_sparse_flags_are_sparse_settings_fields() -> None:
    """One `--prefill-ext-sparse-<field>` per SparseSettings field, with its default, help and choices;
    the options build the server's SparseSettings."""
    given = {}
    for field in dataclasses.fields(SparseSettings):
        flag = FLAGS_BY_NAME[f"sparse_{field.name}"]
        assert (flag.default, flag.help, flag.choices, flag.kind) == (
            field.default,
            field.metadata["help"],
            field.metadata["choices"],
            type(field.default),
        )
        given[flag.name] = field.default
    assert PrefillExtConfig.from_options(given).sparse_settings == SparseSettings()
    argv = ["--prefill-ext-sparse-block-size", "64", "--prefill-ext-sparse-scorer", "pooled"]
    argv += ["--prefill-ext-sparse-mass", "0.5", "--prefill-ext-sparse-last-blocks", "3"]
    config = PrefillExtConfig.from_options(getattr(parse(*argv), OPTIONS_DEST))
    assert config.sparse_settings == SparseSettings(block_size=64, scorer="pooled", mass=0.5, last_blocks=3)


def test_pass_cost_is_parsed_into_the_config() -> None:
    options = getattr(parse("--prefill-ext-pass-cost", "1,2.5,3"), OPTIONS_DEST)
    assert options == {"pass_cost": "1,2.5,3"}  # the options stay plain values (SGLang dumps them)
    assert PrefillExtConfig.from_options(options).pass_cost == PassCost(1.0, 2.5, 3.0)
    assert PrefillExtConfig().pass_cost == PassCost()


def refusal(flag: str, text: str) -> str:
    """The one line a command line's malformed value is refused with (on parsing or in from_options),
    less the flag itself."""
    with pytest.raises(OptionError) as refused:
        PrefillExtConfig.from_options(getattr(parse("--enable-prefill-ext", flag, text), OPTIONS_DEST))
    message = str(refused.value)
    assert message.startswith(flag)
    return message.removeprefix(flag)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        ("--prefill-ext-sparse-block-size abc", "='abc': expected an integer"),
        ("--prefill-ext-dedup-min-tokens 1.5", "='1.5': expected an integer"),
        ("--prefill-ext-sparse-mass abc", "='abc': expected a finite number"),
        ("--prefill-ext-chunk-align-tail nan", "='nan': expected a finite number"),
        ("--prefill-ext-sparse maybe", "='maybe': expected true or false"),
    ],
)
def test_text_not_of_the_flags_kind_refused(argv: str, error: str) -> None:
    flag, text = argv.split()
    with pytest.raises(OptionError, match="^" + re.escape(flag + error) + "$"):
        parse(flag, text)  # on parsing: no argparse usage, no exit status 2
    assert refusal(flag, text) == error


@pytest.mark.parametrize(
    ("flag", "text", "error"),
    [
        (
            "--prefill-ext-eviction",
            "bogus",
            "='bogus': choose from lru, lfu, fifo, mru, filo, priority, slru",
        ),
        ("--prefill-ext-sparse-scorer", "x", "='x': choose from hybrid, sampled, pooled"),
        ("--prefill-ext-pass-cost", "1,2", "='1,2': expected FIXED_MS,TOKEN_US,PAIR_PS (three numbers >= 0)"),
        ("--prefill-ext-pass-cost", "a,b,c", "='a,b,c': expected FIXED_MS,TOKEN_US,PAIR_PS"),
    ],
)
def test_choices_and_formats_refused(flag: str, text: str, error: str) -> None:
    assert refusal(flag, text).startswith(error)


@pytest.mark.parametrize(
    ("flag", "text", "error"),
    [
        ("--prefill-ext-sparse-block-size", "100", "=100: block_size must be a power of two, got 100"),
        ("--prefill-ext-sparse-mass", "1.5", "=1.5: mass must lie in [0, 1], got 1.5"),
        ("--prefill-ext-sparse-threshold", "-1", "=-1.0: threshold must lie in [0, 1], got -1.0"),
        ("--prefill-ext-sparse-samples", "0", "=0: samples must be >= 1, got 0"),
        ("--prefill-ext-sparse-sink-blocks", "-1", "=-1: sink_blocks, local_blocks and last_blocks must be"),
        ("--prefill-ext-dedup-min-tokens", "-1", "=-1: must be >= 0"),
        ("--prefill-ext-sparse-min-len", "-5", "=-5: must be >= 0"),
        ("--prefill-ext-sparse-max-density", "1.5", "=1.5: max_density must lie in [0, 1], got 1.5"),
        ("--prefill-ext-sparse-guard", "1.5", "=1.5: guard must lie in [0, 1], got 1.5"),
        ("--prefill-ext-sparse-guard", "-0.1", "=-0.1: guard must lie in [0, 1], got -0.1"),
        ("--prefill-ext-sparse-guard-every", "-1", "=-1: guard_every must be >= 0, got -1"),
        ("--prefill-ext-sparse-layer-mass", "1-2", "='1-2': layer_mass: expected A-B=V"),
        ("--prefill-ext-sparse-layer-mass", "1-2=2", "='1-2=2': layer_mass: '1-2=2' needs a mass in [0, 1]"),
        ("--prefill-ext-sparse-layer-stride", "1-2=3", "='1-2=3': layer_stride: '1-2=3' needs a stride"),
        ("--prefill-ext-sparse-layer-stride", "1-2=256", "='1-2=256': stride 256 must divide block_size 128"),
        ("--prefill-ext-sparse-layer-stride", "1-2=4,2-3=8", "='1-2=4,2-3=8': layer_stride: '2-3=8' over"),
        ("--prefill-ext-pass-budget-ms", "-25", "=-25.0: must be >= 0"),
        ("--prefill-ext-fingerprint-block", "16", "=16: must be >= 32"),
    ],
)
def test_values_out_of_range_refused(flag: str, text: str, error: str) -> None:
    """SparseSettings' own checks for its flags; every other int option is a count."""
    assert refusal(flag, text).startswith(error)


def test_sparse_flags_refused_together_name_each_flag() -> None:
    """Flags each valid alone that SparseSettings refuses together: one OptionError naming the flags given."""
    stride = ("--prefill-ext-sparse-layer-stride", "7-20=4")
    with pytest.raises(
        OptionError, match="^--prefill-ext-sparse-layer-stride, --prefill-ext-sparse-per-layer: "
    ):
        PrefillExtConfig.from_options(
            getattr(parse(*stride, "--prefill-ext-sparse-per-layer", "false"), OPTIONS_DEST)
        )
    coarse = ("--prefill-ext-sparse-block-size", "64", "--prefill-ext-sparse-layer-stride", "7-20=128")
    with pytest.raises(OptionError, match="stride 128 must divide block_size 64$"):
        PrefillExtConfig.from_options(getattr(parse(*coarse), OPTIONS_DEST))


def test_the_layer_stride_flag_sets_each_layers_stride() -> None:
    argv = ["--prefill-ext-sparse-stride", "16", "--prefill-ext-sparse-layer-stride", "7-20=4"]
    settings = PrefillExtConfig.from_options(getattr(parse(*argv), OPTIONS_DEST)).sparse_settings
    assert [settings.at_layer(layer).stride for layer in (6, 7, 20, 21)] == [16, 4, 4, 16]
    assert SparseSettings.layer_stride == ""  # off unless asked for


def test_values_in_range_accepted() -> None:
    argv = ["--prefill-ext-short-window-s", "-1", "--prefill-ext-sparse-threshold", "0"]
    argv += ["--prefill-ext-sparse-max-density", "1", "--prefill-ext-decode-adaptive-budget", "0"]
    config = PrefillExtConfig.from_options(getattr(parse(*argv), OPTIONS_DEST))
    assert (config.short_window_s, config.sparse_settings.threshold) == (-1.0, 0.0)
    assert (config.sparse_settings.max_density, config.decode_adaptive_budget) == (1.0, 0)


@pytest.mark.parametrize(("guard", "every"), [("0.5", "4"), ("1", "0"), ("0", "1")])
def test_the_guard_flags_set_their_settings(guard: str, every: str) -> None:
    argv = ["--prefill-ext-sparse-guard", guard, "--prefill-ext-sparse-guard-every", every]
    settings = PrefillExtConfig.from_options(getattr(parse(*argv), OPTIONS_DEST)).sparse_settings
    assert (settings.guard, settings.guard_every) == (float(guard), int(every))
    assert (SparseSettings.guard, SparseSettings.guard_every) == (0.0, 0)  # off unless asked for


def test_fingerprints_need_the_request_log() -> None:
    with pytest.raises(OptionError, match="^--prefill-ext-log-fingerprints needs --prefill-ext-log$"):
        PrefillExtConfig.from_options({"log_fingerprints": True})
    config = PrefillExtConfig.from_options({"log_fingerprints": True, "log": "requests.jsonl"})
    assert (config.fingerprint_block, config.fingerprint_salt) == (256, "")


def test_blend_and_its_ratio() -> None:
    """--prefill-ext-blend parses (the versions that serve it: docs/FLAGS.md); its ratio needs it."""
    config = PrefillExtConfig.from_options(getattr(parse("--prefill-ext-blend"), OPTIONS_DEST))
    assert (config.blend, config.blend_recompute_ratio) == (True, 0.15)
    argv = ("--prefill-ext-blend", "--prefill-ext-blend-recompute-ratio", "0.5")
    assert PrefillExtConfig.from_options(getattr(parse(*argv), OPTIONS_DEST)).blend_recompute_ratio == 0.5
    with pytest.raises(OptionError, match="^--prefill-ext-blend-recompute-ratio needs --prefill-ext-blend$"):
        PrefillExtConfig.from_options({"blend_recompute_ratio": 0.2})
    with pytest.raises(OptionError, match=r"^--prefill-ext-blend-recompute-ratio=1.5: must lie in \[0, 1\]$"):
        PrefillExtConfig.from_options({"blend_recompute_ratio": 1.5})
    assert PrefillExtConfig.from_options({"blend": False}) == PrefillExtConfig()
    assert (PrefillExtConfig.blend, PrefillExtConfig.blend_recompute_ratio) == (False, 0.15)


def test_unknown_or_invalid_options_refused() -> None:
    with pytest.raises(ValueError, match="unknown prefill-ext options: bogus"):
        PrefillExtConfig.from_options({"bogus": 1})
    with pytest.raises(ValueError, match="--prefill-ext-eviction='random'"):
        PrefillExtConfig.from_options({"eviction": "random"})


def test_one_accessor_reads_the_options_once(sglang_harness: ModuleType) -> None:
    """`prefill_ext_config` on SGLang's own ServerArgs: None with the flag off, else the checked config,
    the same object for the same options (parsed once); options without the flag refused. Options every
    supported version serves."""
    assert prefill_ext_config(sglang_harness.parse_server_args()) is None
    argv = ("--enable-prefill-ext", "--prefill-ext-eviction", "cost", "--prefill-ext-dedup-min-tokens", "8")
    first, second = (prefill_ext_config(sglang_harness.parse_server_args(*argv)) for _ in range(2))
    assert first is second
    assert first == PrefillExtConfig(eviction="cost", dedup_min_tokens=8)
    with pytest.raises(OptionError, match="^--prefill-ext-dedup given without --enable-prefill-ext$"):
        sglang_harness.parse_server_args("--prefill-ext-dedup", "false")
