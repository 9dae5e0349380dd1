"""The extension's options: one dataclass, shown to SGLang's CLI as `--prefill-ext-*` flags.

Version-free: the per-version server-args hook calls `add_cli_args(parser)`; every flag lands in
one namespace entry, `prefill_ext_options` (a dict of only the flags given), which SGLang's
`ServerArgs.from_cli_args` copies like any other field. `PrefillExtConfig.from_options` fills
in the defaults and validates.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

OPTIONS_DEST = "prefill_ext_options"
ENABLE_FLAG = "--enable-prefill-ext"
EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "cost")
SCHEDULES = ("auto", "lpm-aging", "stock")


def _option(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclasses.dataclass(frozen=True)
class PrefillExtConfig:
    eviction: str = _option(
        "lru",
        "Eviction policy of the extension's prefix tree: SGLang's own (lru, lfu, fifo, mru, filo, "
        "priority) or 'cost', which keeps nodes whose recomputation costs most (tokens x depth, "
        "weighted by hits and recency).",
        EVICTION_POLICIES,
    )

    schedule: str = _option(
        "auto",
        "Prefill queue order: 'lpm-aging' (longest cached prefix first, matches refreshed only when the "
        "tree changed, no queue-length cutoff, requests waiting --prefill-ext-max-wait-passes passes go "
        "first), 'stock' (SGLang's --schedule-policy), or 'auto' (lpm-aging when --schedule-policy is "
        "lpm, else stock).",
        SCHEDULES,
    )
    dedup: bool = _option(
        True,
        "In-flight dedup: a waiting request whose next uncached pages are being computed by a scheduled "
        "or chunked request waits for them to land in the tree instead of computing them again.",
    )
    dedup_min_tokens: int = _option(
        64, "Wait for in-flight pages only when they cover at least this many of a request's tokens."
    )
    dedup_max_wait_passes: int = _option(
        256, "Safety bound: past this many passes waiting on in-flight pages, a request computes them itself."
    )
    max_wait_passes: int = _option(
        32, "lpm-aging: a request that has waited this many scheduling passes is ordered first (FCFS)."
    )

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> PrefillExtConfig:
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown prefill-ext options: {', '.join(unknown)}")
        config = cls(**options)
        for f in dataclasses.fields(cls):
            choices = f.metadata["choices"]
            value = getattr(config, f.name)
            if choices and value not in choices:
                raise ValueError(f"--prefill-ext-{f.name.replace('_', '-')}={value!r}: choose from {choices}")
        return config


class _StoreOption(argparse.Action):
    """Store one `--prefill-ext-*` value under its name in the shared options dict."""

    def __call__(self, parser, namespace, values, option_string=None):
        options = dict(getattr(namespace, OPTIONS_DEST, None) or {})
        options[self.metavar_name] = values
        setattr(namespace, OPTIONS_DEST, options)

    def __init__(self, *args, option_name: str, **kwargs):
        self.metavar_name = option_name
        super().__init__(*args, **kwargs)


def _cli_type(field: dataclasses.Field) -> Any:
    default = field.default
    if isinstance(default, bool):
        return lambda text: text.lower() in ("1", "true", "yes", "on")
    if isinstance(default, (int, float)):
        return type(default)
    return str


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Register `--enable-prefill-ext` and one `--prefill-ext-NAME` per config field."""
    group = parser.add_argument_group("sglang-prefill-ext")
    group.add_argument(
        ENABLE_FLAG,
        dest="enable_prefill_ext",
        action="store_true",
        help="Use sglang-prefill-ext's prefix tree and prefill pipeline (default: off, stock SGLang).",
    )
    parser.set_defaults(**{OPTIONS_DEST: None})
    for f in dataclasses.fields(PrefillExtConfig):
        group.add_argument(
            f"--prefill-ext-{f.name.replace('_', '-')}",
            dest=f"_prefill_ext_{f.name}",
            action=_StoreOption,
            option_name=f.name,
            type=_cli_type(f),
            choices=f.metadata["choices"],
            default=argparse.SUPPRESS,
            help=f"{f.metadata['help']} (default: {f.default})",
        )
