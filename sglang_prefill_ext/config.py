"""The extension's options: one dataclass, shown to SGLang's CLI as `--prefill-ext-*` flags.

Version-free: the per-version server-args hook calls `add_cli_args(parser)`; every flag lands in
one namespace entry, `prefill_ext_options` (a dict of only the flags given, each value read as its
kind), which SGLang's `ServerArgs.from_cli_args` copies like any other field.
`PrefillExtConfig.from_options` checks the values and fills in the defaults. `FLAGS` lists the
flags: one per config field, and one per `SparseSettings` field (`--prefill-ext-sparse-<field>`,
its default and help from `ops/settings.py`). A malformed value raises `OptionError`, which the
hooks print as one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from sglang_prefill_ext.doctor.fingerprint import MIN_BLOCK
from sglang_prefill_ext.ops.settings import SparseSettings
from sglang_prefill_ext.radix.eviction import POLICIES
from sglang_prefill_ext.runner.goodput import HEADROOM
from sglang_prefill_ext.runner.pass_cost import PassCost

OPTIONS_DEST = "prefill_ext_options"
ENABLE_DEST = "enable_prefill_ext"
ENABLE_FLAG = "--enable-prefill-ext"
ENABLE_HELP = (
    "The extension's prefix tree (PrefillExtRadixCache) in place of SGLang's radix cache, and its prefill "
    "runner in the scheduler; request token ids outside [0, vocab_size) are refused with HTTP 400 (stock "
    "0.5.17 lets them reach the model and its scheduler dies). Off: stock SGLang."
)
EVICTION_POLICIES = tuple(POLICIES)
# The tree's policy unless one is asked for (or a non-default --radix-eviction-policy): `reuse` beats
# stock LRU on every replay trace and recomputes 44-74 % fewer tokens on the H200 pressure phase at
# 1.5-3x the pool (bench/results/2026-12-01-h200-eviction.md); elsewhere nothing is evicted.
DEFAULT_EVICTION = "reuse"
SGLANG_DEFAULT_EVICTION = "lru"  # --radix-eviction-policy's default
SCHEDULES = ("auto", "lpm-aging", "stock")
SPARSE_SETTINGS_PREFIX = "sparse_"  # SparseSettings' field X is the option sparse_X


class OptionError(ValueError):
    """A refused `--prefill-ext-*` configuration; on SGLang's command line it prints as one line."""


def _non_negative(value: float) -> float:
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _fingerprint_block(value: int) -> int:
    if value < MIN_BLOCK:
        raise ValueError(f"must be >= {MIN_BLOCK}")
    return value


def _fraction(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError("must lie in [0, 1]")
    return value


def _option(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    check: Callable[[Any], Any] | None = None,
) -> Any:
    """A config field and its flag: `help` and `choices` as `--help` shows them; `check` returns the
    config's value for a value given, or raises ValueError saying why not (without one, an int option
    is a count: >= 0). A default of another type than bool, int, float and str (PassCost) is given as
    text, which `check` parses."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "check": check})


@dataclasses.dataclass(frozen=True)
class PrefillExtConfig:
    eviction: str | None = _option(
        None,
        "Eviction policy of the extension's prefix tree: reuse (the leaf predicted to be reused last goes "
        "first: each node's last reuse interval, in requests, predicts its next use while intervals repeat, "
        "else least recently used; waiting requests' prefixes last; only the tail still needed is cut from "
        "the last leaf), SGLang's lru, lfu, fifo, mru, filo, priority, slru, or cost (least expected "
        "recompute cost per slot: log-damped hits over idle time, times a per-token cost growing with "
        f"depth). Unset: {DEFAULT_EVICTION}, unless --radix-eviction-policy names a policy other than "
        f"{SGLANG_DEFAULT_EVICTION}, which is then used (for LRU give {SGLANG_DEFAULT_EVICTION} here).",
        EVICTION_POLICIES,
    )
    dedup: bool = _option(
        True,
        "In-flight dedup: a waiting request whose next uncached pages are being computed by a scheduled or "
        "chunked request waits for them to land in the tree, then reuses them. If the producer finishes, "
        "aborts or is retracted, waiters compute what is still missing.",
    )
    dedup_min_tokens: int = _option(
        64, "Wait only when the in-flight pages cover at least this many of the request's tokens."
    )
    dedup_max_wait_passes: int = _option(
        256, "Safety bound: after this many passes waiting, a request computes the pages itself."
    )
    protect_waiting: bool = _option(
        True,
        "Each pass, the cached prefix each waiting request matches is marked used, the queue's head last, "
        "so eviction takes the prefixes the scheduler reaches last. Without it LRU evicts the context of "
        "the request that waited longest, i.e. the one admitted next.",
    )
    schedule: str = _option(
        "auto",
        "Prefill queue order: lpm-aging (longest cached prefix first, no 128-request cutoff, a request "
        "re-matched only when its match could have grown, requests that waited "
        "--prefill-ext-max-wait-passes passes first), stock (SGLang's --schedule-policy) or auto "
        "(lpm-aging when --schedule-policy is lpm, else stock).",
        SCHEDULES,
    )
    chunk_align_tail: float = _option(
        0.25,
        "A chunked prompt's chunk ends on a page boundary and, when a waiting request's prompt stops "
        "sharing it in this last fraction of the chunk, at that divergence point: the landed chunk is the "
        "node the waiter matches (0: page boundaries only).",
        check=_fraction,
    )
    decode_adaptive_budget: int = _option(
        0,
        "N: with more than N requests decoding, a pass's prefill chunk shrinks to --chunked-prefill-size "
        "x N / decoding (page-aligned, at least --prefill-ext-decode-budget-min-tokens), bounding how long "
        "one prefill pass stalls decoding; 0 keeps --chunked-prefill-size.",
    )
    decode_budget_min_tokens: int = _option(1024, "The adaptive chunk never goes below this many tokens.")
    max_wait_passes: int = _option(
        32, "lpm-aging: a request that has waited this many scheduling passes goes first (oldest first)."
    )
    log: str = _option(
        "",
        "Append one JSON line per finished or aborted request to this file: rid, input_len, cached_tokens, "
        "deduped_tokens, chunks, queue_passes (scheduling passes it waited), budgeted_chunks (its chunks a "
        "pass budget shortened), queue_ms, prefill_ms, ttft_ms, output_tokens, error, blend (under "
        "--prefill-ext-blend, a request with chunk_spans: its chunk tokens reused and recomputed, else null). "
        "Empty: off.",
    )
    log_fingerprints: bool = _option(
        False,
        "Add the prompt's fingerprint to each --prefill-ext-log line, for sglang-prefill-ext doctor: "
        "start_ms (its first forward, on the scheduler's clock), fp_block (the block size), fp (a 64-bit "
        "keyed hash of each full block of --prefill-ext-fingerprint-block tokens), fp_anchors and "
        "fp_anchored (offsets and hashes of half-size blocks at content-defined anchors, which match "
        "wherever the same tokens recur), and a line {flush_ms} when the cache is flushed. Hashes only, no "
        "token ids.",
    )
    fingerprint_block: int = _option(
        256,
        f"Tokens per fingerprinted block (at least {MIN_BLOCK}); the default is page-aligned for every "
        "power-of-two page size up to 256.",
        check=_fingerprint_block,
    )
    fingerprint_salt: str = _option(
        "",
        "The key of the fingerprint hashes (BLAKE2b): logs are comparable only under one salt, and a secret "
        "salt keeps a known text's hashes from being matched against a log. Empty: unkeyed.",
    )
    pass_log: str = _option(
        "",
        "Append one JSON line per prefill pass to this file: its time, waiting and short requests, whether "
        "the pass budget set it, the chunk budget, the cost model's prediction and, per admitted request, "
        "new tokens, cached tokens and whether its prompt continues. Empty: off.",
    )
    pass_budget_ms: float = _option(
        0.0,
        "Short requests first: while short requests arrive (one seen within --prefill-ext-short-window-s), "
        "every prefill pass is sized to this predicted forward time (--prefill-ext-pass-cost); waiting short "
        "requests go ahead of longer ones and ride the next pass (as many as fit in the budget, at least "
        "one), and a long prompt's chunk takes the rest (at least --prefill-ext-min-long-chunk tokens). "
        "0: off (SGLang's chunk size every pass).",
        check=_non_negative,
    )
    tbt_target_ms: float = _option(
        0.0,
        "Goodput scheduling (runner/goodput.py): decodes ride every prefill pass (SGLang's mixed chunk, "
        "turned on by this flag) and, while a request decodes or a short one waits beside a long prompt's "
        "chunk, each pass is held to a predicted forward time (--prefill-ext-pass-cost) of "
        f"{HEADROOM:g} x this target, so every decoding request gets a token about this often; waiting "
        "short requests go first by deadline slack (--prefill-ext-short-ttft-target-ms), the chunked long "
        "prompt takes what is left; "
        "otherwise SGLang's full chunks (a lone prompt, or a burst of short ones with nobody decoding, runs "
        "as on stock). 0: off. Not with --prefill-ext-pass-budget-ms.",
        check=_non_negative,
    )
    short_ttft_target_ms: float = _option(
        250.0,
        "Goodput scheduling: the TTFT target a waiting short request's deadline slack is counted from.",
        check=_non_negative,
    )
    lone_pass_ms: float = _option(
        0.0,
        "Goodput scheduling: with nobody decoding and no short request waiting, hold a long prompt's chunk "
        "to this predicted forward time too, so a short request arriving mid-prompt waits for a smaller pass; "
        "every lone long prompt pays the extra passes. 0: SGLang's full chunk (a lone prompt runs as on stock).",
        check=_non_negative,
    )
    lone_chunk_sync: bool = _option(
        True,
        "Goodput scheduling under SGLang's overlap event loop: while a long prompt prefills alone (one "
        "continuing chunk, nobody decoding), its next chunk is formed once the running chunk finished, not "
        "while it runs, so a short request arriving mid-chunk rides the very next pass instead of waiting "
        "behind a full chunk formed before it came. The lone prompt keeps SGLang's full chunks; each of its "
        "chunk boundaries loses the overlap of one scheduling step. false: the next chunk is formed ahead, "
        "as on stock.",
    )
    yield_layers: int = _option(
        0,
        "N: a lone long prompt's prefill pass (one request of more than --prefill-ext-short-max-tokens new "
        "tokens, nobody decoding) runs as SGLang's split prefill in slices of N layers; after each slice the "
        "scheduler receives requests and runs one pass of its own before the next slice: a short request's "
        "prefill (its decodes riding under mixed chunk), else a decode step of the requests decoding. The "
        "sliced chunk keeps its KV slots and resumes with its attention metadata re-initialized; it runs "
        "without a CUDA graph. Needs --disable-overlap-schedule. 0: off (whole passes, as on stock).",
    )
    short_max_tokens: int = _option(
        4096,
        "Short requests first and goodput scheduling: a waiting request with at most this many uncached "
        "tokens is short.",
    )
    short_window_s: float = _option(
        1.0,
        "Short requests first: passes stay budgeted this long after the last short request was seen; "
        "negative: every pass (Sarathi-style).",
    )
    min_long_chunk: int = _option(
        512,
        "Short requests first and goodput scheduling: a budgeted pass never shrinks a long prompt's chunk "
        "below this many tokens, so long prompts keep progressing.",
    )
    pass_cost: PassCost = _option(
        PassCost(),
        "The forward-time model of a prefill pass, FIXED_MS,TOKEN_US,PAIR_PS: a fixed cost, a cost per new "
        "token and one per (new token, context token) pair of causal attention, fitted on the H200 for the "
        "8B shape on fa3; refit for another model or GPU from a stock run's single-prompt TTFTs with "
        "python -m bench.serving.fit_pass_cost.",
        check=PassCost.parse,
    )
    sparse: bool = _option(
        False,
        "Block-sparse prefill attention for extend batches with a request of at least "
        "--prefill-ext-sparse-min-len tokens bringing at least --prefill-ext-sparse-min-extend new ones, on "
        "the server's prefill attention backend when it is fa3 (SGLang's default for MHA models on Hopper) "
        "or flashinfer (the default on most other NVIDIA GPUs); with any other backend the server refuses "
        "to start, naming the backend it resolved. Decode, short prompts and every other batch keep the "
        "backend's own attention and its CUDA graphs.",
    )
    # Not a flag itself: each of its fields is one (SPARSE_SETTINGS_PREFIX + the field's name).
    sparse_settings: SparseSettings = dataclasses.field(default_factory=SparseSettings)
    sparse_min_len: int = _option(
        32768, "Prefix + new tokens of the longest request for a batch to go sparse."
    )
    sparse_min_extend: int = _option(
        1024,
        "New tokens that request must bring: cache hits and short follow-ups over a long prefix stay dense "
        "(for so few queries dense attention is cheaper than selecting and planning).",
    )
    blend: bool = _option(
        False,
        "Chunk blending (CacheBlend-style, docs/BLEND.md): the KV of retrieved chunks a request marks "
        "(chunk_spans) reused wherever they recur, re-rotated to their new positions, a fraction of their "
        "tokens recomputed. Needs --page-size 1 and chunked prefill.",
    )
    blend_recompute_ratio: float = _option(
        0.15,
        "With --prefill-ext-blend: the fraction of each reused chunk's tokens recomputed through every "
        "layer over the blended KV (the default is CacheBlend's).",
        check=_fraction,
    )

    def tree_eviction(self, sglang_policy: str) -> str:
        """The tree's policy: this option when given, else a non-default `--radix-eviction-policy`,
        else DEFAULT_EVICTION (pass `--prefill-ext-eviction lru` for LRU)."""
        if self.eviction is not None:
            return self.eviction
        sglang_policy = sglang_policy.lower()
        return DEFAULT_EVICTION if sglang_policy == SGLANG_DEFAULT_EVICTION else sglang_policy

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> PrefillExtConfig:
        """The config for a dict of given flags (by `Flag.name`; each value of its flag's kind, or text
        as a command line gives it), the defaults for the rest; OptionError for an unknown or malformed one."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(FLAGS_BY_NAME))
        if unknown:
            raise OptionError(f"unknown prefill-ext options: {', '.join(unknown)}")
        fields: dict[str, Any] = {}
        settings: dict[str, Any] = {}
        for name, given in options.items():
            flag = FLAGS_BY_NAME[name]
            value = flag.value(given)
            if flag.setting is None:
                fields[name] = value
            else:
                settings[flag.setting] = value
        try:
            sparse_settings = SparseSettings(**settings)
        except ValueError as error:  # flags each valid alone that SparseSettings refuses together
            names = [f.name for f in dataclasses.fields(SparseSettings) if f.name in settings]  # one order
            given = ", ".join(option_name(SPARSE_SETTINGS_PREFIX + name) for name in names)
            raise OptionError(f"{given}: {error}") from None
        config = cls(**fields, sparse_settings=sparse_settings)
        if config.tbt_target_ms > 0 and config.pass_budget_ms > 0:
            raise OptionError(
                "--prefill-ext-tbt-target-ms and --prefill-ext-pass-budget-ms are two pass budgets: give one"
            )
        if config.lone_pass_ms > 0 and not config.tbt_target_ms > 0:
            raise OptionError(f"{option_name('lone_pass_ms')} needs {option_name('tbt_target_ms')}")
        if config.log_fingerprints and not config.log:
            raise OptionError(f"{option_name('log_fingerprints')} needs {option_name('log')}")
        if "blend_recompute_ratio" in options and not config.blend:
            raise OptionError(f"{option_name('blend_recompute_ratio')} needs {option_name('blend')}")
        return config


def option_name(name: str) -> str:
    """The flag of an options-dict key: `sparse_min_len` -> `--prefill-ext-sparse-min-len`."""
    return f"--prefill-ext-{name.replace('_', '-')}"


def sparse_flags(settings: SparseSettings) -> list[str]:
    """The `--prefill-ext-sparse-*` flags that give a server `settings`: one per field off its default."""
    default = SparseSettings()
    flags = []
    for field in dataclasses.fields(SparseSettings):
        value = getattr(settings, field.name)
        if value != getattr(default, field.name):
            flags += [option_name(SPARSE_SETTINGS_PREFIX + field.name), _shown(value)]
    return flags


def _shown(value: Any) -> str:
    """A default as `--help` writes it (and docs/FLAGS.md)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) or "off"


def _with_default(help: str, default: str) -> str:
    """A flag's `--help` text: its help, then its default as `_shown` writes it."""
    return f"{help} (default: {default})"


def _read_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError("expected true or false")
    return lowered in ("1", "true", "yes", "on")


def _read_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected an integer") from None


def _read_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


_READERS: dict[type, Callable[[str], Any]] = {bool: _read_bool, int: _read_int, float: _read_float, str: str}
_METAVARS = {bool: "BOOL", int: "INT", float: "FLOAT", str: "TEXT"}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One `--prefill-ext-*` flag: `name` is its key in the options dict, its values are of `kind`
    (text on a command line is read as one), and `check` turns a value into the config's or raises
    ValueError. `setting`: the SparseSettings field it sets, if any."""

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] | None
    check: Callable[[Any], Any] | None
    setting: str | None = None

    @property
    def option(self) -> str:
        return option_name(self.name)

    @property
    def shown_default(self) -> str:
        """The default as `--help` writes it."""
        return _shown(self.default)

    def read(self, text: str) -> Any:
        """A command line's text as a value of the flag's kind (choices and ranges aside)."""
        try:
            return _READERS[self.kind](text)
        except ValueError as error:
            raise self._refused(text, error) from None

    def value(self, given: Any) -> Any:
        """The config's value for `given` (text is read first)."""
        value = self.read(given) if isinstance(given, str) else given
        try:
            if self.choices and value not in self.choices:
                raise ValueError(f"choose from {', '.join(self.choices)}")
            return value if self.check is None else self.check(value)
        except ValueError as error:
            raise self._refused(given, error) from None

    def _refused(self, given: Any, error: ValueError) -> OptionError:
        return OptionError(f"{self.option}={given!r}: {error}")


def _flag(name: str, default: Any, metadata: Mapping[str, Any], setting: str | None = None) -> Flag:
    kind = type(default) if type(default) in _READERS else str  # None (unset) and parsed text
    check = metadata.get("check") or (_non_negative if kind is int else None)
    return Flag(name, kind, default, metadata["help"], metadata["choices"], check, setting)


def _sparse_setting(name: str) -> Callable[[Any], Any]:
    """SparseSettings' own check of its field `name` (its `__post_init__`, the other fields at their defaults)."""

    def check(value: Any) -> Any:
        SparseSettings(**{name: value})
        return value

    return check


def _flags() -> tuple[Flag, ...]:
    flags = []
    for field in dataclasses.fields(PrefillExtConfig):
        if field.name != "sparse_settings":
            flags.append(_flag(field.name, field.default, field.metadata))
            continue
        for setting in dataclasses.fields(SparseSettings):
            metadata = {**setting.metadata, "check": _sparse_setting(setting.name)}
            flags.append(
                _flag(SPARSE_SETTINGS_PREFIX + setting.name, setting.default, metadata, setting.name)
            )
    return tuple(flags)


FLAGS = _flags()
FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}


class _StoreOption(argparse.Action):
    """Store one flag's value, read as its kind, under its name in the shared options dict. Text that
    is not of the flag's kind raises OptionError (one line at launch, where argparse's own `type` would
    print its usage and exit with status 2); choices and ranges are checked in `from_options`."""

    def __init__(self, *args: Any, flag: Flag, **kwargs: Any) -> None:
        self.flag = flag
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        options = dict(getattr(namespace, OPTIONS_DEST, None) or {})
        options[self.flag.name] = self.flag.read(values) if isinstance(values, str) else values
        setattr(namespace, OPTIONS_DEST, options)


def _cli_kwargs(flag: Flag) -> dict[str, Any]:
    """argparse keywords: bools read as switches with an optional value; choices shown as argparse
    shows its own."""
    if flag.kind is bool:
        return {"nargs": "?", "const": True, "metavar": _METAVARS[bool]}
    if flag.choices:
        return {"metavar": "{" + ",".join(flag.choices) + "}"}
    return {"metavar": _METAVARS[flag.kind]}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Register `--enable-prefill-ext` and one `--prefill-ext-NAME` per flag of FLAGS."""
    group = parser.add_argument_group("sglang-prefill-ext")
    group.add_argument(
        ENABLE_FLAG, dest=ENABLE_DEST, action="store_true", help=_with_default(ENABLE_HELP, "off")
    )
    parser.set_defaults(**{OPTIONS_DEST: None})
    for flag in FLAGS:
        group.add_argument(
            flag.option,
            dest=f"_prefill_ext_{flag.name}",
            action=_StoreOption,
            flag=flag,
            default=argparse.SUPPRESS,
            help=_with_default(flag.help, flag.shown_default),
            **_cli_kwargs(flag),
        )
