"""Version-free halves of the per-version server hooks.

Each `vX_Y_Z/hooks.py` keeps only what differs between SGLang versions (which `ServerArgs`
fields conflict with the extension, and which tree-cache builder to import) and delegates the
rest here. Like the hooks modules, this imports nothing from SGLang: the patched
`sglang.srt.server_args` imports the hooks while it is itself being imported.
"""

from __future__ import annotations

import argparse
import array
import functools
import sys
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import numpy as np

from sglang_prefill_ext import config

# ServerArgs flags, present in every supported version, whose meaning the extension's prefix tree
# would silently override. A version adds its own on top (see `conflicting_flags`).
COMMON_CONFLICTING_FLAGS: Mapping[str, str] = {
    "disable_radix_cache": "--disable-radix-cache (the extension is a radix cache)",
    "radix_cache_backend": "--radix-cache-backend (the extension installs its own tree cache)",
    "enable_hierarchical_cache": "--enable-hierarchical-cache",
    "enable_lmcache": "--enable-lmcache",
    "enable_flexkv": "--enable-flexkv",
    "enable_session_radix_cache": "--enable-session-radix-cache",
}


def conflicting_flags(**extra: str) -> dict[str, str]:
    """The common conflicts plus one version's own (`field_name="--flag (why)"`)."""
    return {**COMMON_CONFLICTING_FLAGS, **extra}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    config.add_cli_args(parser)
    _print_option_errors_as_one_line()


def _print_option_errors_as_one_line() -> None:
    """On a command line (SGLang builds a parser only there), a refused configuration that reaches
    the top prints as `error: <why>` (exit status 1) instead of a traceback into SGLang's internals;
    every other exception keeps the hook it had. Library callers still catch the ValueError."""
    previous = sys.excepthook
    if getattr(previous, "prints_option_errors", False):
        return

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, config.OptionError):
            print(f"error: {error}", file=sys.stderr)
        else:
            previous(kind, error, tb)

    hook.prints_option_errors = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def extension_enabled(server_args: Any) -> bool:
    return bool(getattr(server_args, config.ENABLE_DEST, False))


def prefill_ext_config(server_args: Any) -> config.PrefillExtConfig | None:
    """The extension's options for `server_args`, None with `--enable-prefill-ext` off: the one way
    every hook reads them. Checked and parsed once per process for each set of options given;
    OptionError for a malformed one."""
    if not extension_enabled(server_args):
        return None
    return _config(frozenset(_given_options(server_args).items()))


@functools.cache
def _config(options: frozenset[tuple[str, Any]]) -> config.PrefillExtConfig:
    return config.PrefillExtConfig.from_options(dict(options))


def _given_options(server_args: Any) -> dict[str, Any]:
    return getattr(server_args, config.OPTIONS_DEST, None) or {}


def _flags(names: Iterable[str]) -> str:
    return ", ".join(map(config.option_name, names))


def validate_server_args(
    server_args: Any,
    conflicts: Mapping[str, str],
    ported: frozenset[str] | None,
    version: str,
    unported_why: Mapping[str, str] | None = None,
) -> None:
    """Refuse, before any model loads, a configuration the extension cannot serve correctly.

    `ported` names the options this SGLang version's hooks serve (None: all of them); `unported_why`
    says, for some of the others, why not (the refusal's line ends with it).
    """
    given = _given_options(server_args)
    if not extension_enabled(server_args):
        if given:
            raise config.OptionError(f"{_flags(given)} given without {config.ENABLE_FLAG}")
        return
    unported = sorted(set(given) - ported) if ported is not None else []
    if unported:  # first: what this version lacks says more than how its options would combine
        why = "; ".join(text for name, text in (unported_why or {}).items() if name in unported)
        raise config.OptionError(
            f"{_flags(unported)}: not available on SGLang {version} yet" + (f" ({why})" if why else "")
        )
    prefill_ext_config(server_args)  # refuses malformed values
    found = [text for name, text in conflicts.items() if getattr(server_args, name, None)]
    if found:
        raise config.OptionError(f"{config.ENABLE_FLAG} cannot be combined with: {'; '.join(found)}")


def validate_attention_backend(server_args: Any, backends: tuple[str, ...]) -> None:
    """Refuse `--prefill-ext-sparse` when the backend that runs prefill attention is not one the version's
    hooks subclass (`backends`). Unresolved (no backend given, SGLang has not picked its default yet):
    nothing to check."""
    ext_config = prefill_ext_config(server_args)
    if ext_config is None or not ext_config.sparse:
        return
    backend = prefill_attention_backend(server_args)
    if backend is not None and backend not in backends:
        raise config.OptionError(
            f"--prefill-ext-sparse needs the {' or '.join(backends)} attention backend; this server's "
            f"prefill runs on {backend} (choose one with --attention-backend)"
        )


def prefill_attention_backend(server_args: Any) -> str | None:
    """The backend that runs prefill attention (`--prefill-attention-backend`, else `--attention-backend`;
    after `ServerArgs` resolution, the one SGLang picked)."""
    return getattr(server_args, "prefill_attention_backend", None) or getattr(
        server_args, "attention_backend", None
    )


def validate_token_ids(
    input_ids: list[int] | list[list[int]], vocab_size: int, stock_check: Callable[[Any, int], None]
) -> None:
    """Raise ValueError (HTTP 400) for ids >= vocab_size (with SGLang's own check and message,
    `stock_check`) or < 0; a flat list or a batch of lists. This runs on the TTFT path: a row is
    packed into C unsigned ints (C speed; refuses negative ids) and its max taken by numpy,
    0.065 ms for 16K ids where Python's max() + min() take 0.33 ms and SGLang's generator 2 ms for
    100K. Only a row that fails there is walked again in Python to find which message it gets."""
    rows = input_ids if isinstance(input_ids[0], list) else [input_ids]
    for row in rows:
        if row and not _within(row, vocab_size):
            if max(row) >= vocab_size:
                stock_check(row, vocab_size)  # raises with the message stock gives that row
            if min(row) < 0:
                raise ValueError(
                    f"The input_ids contain a negative token id ({min(row)}); valid range is [0, {vocab_size})."
                )


def _within(row: list[int], vocab_size: int) -> bool:
    try:
        packed = array.array("I", row)
    except (OverflowError, TypeError):  # negative, >= 2**32, or not an int
        return False
    return int(np.frombuffer(packed, dtype=np.uintc).max()) < vocab_size
