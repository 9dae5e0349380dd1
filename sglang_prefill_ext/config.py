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

from sglang_prefill_ext.ops.settings import SCORERS, SparseSettings
from sglang_prefill_ext.radix.eviction import POLICIES
from sglang_prefill_ext.runner.short_first import PassCost

OPTIONS_DEST = "prefill_ext_options"
ENABLE_FLAG = "--enable-prefill-ext"
EVICTION_POLICIES = tuple(POLICIES)
# The tree's policy unless one is asked for (or a non-default --radix-eviction-policy): `reuse` beats
# stock LRU on every replay trace and recomputes 44-74 % fewer tokens on the H200 pressure phase at
# 1.5-3x the pool (bench/results/2026-12-01-h200-eviction.md); elsewhere nothing is evicted.
DEFAULT_EVICTION = "reuse"
SGLANG_DEFAULT_EVICTION = "lru"  # --radix-eviction-policy's default
SCHEDULES = ("auto", "lpm-aging", "stock")
SPARSE = SparseSettings()  # the selection's own defaults


class OptionError(ValueError):
    """A refused `--prefill-ext-*` configuration; on SGLang's command line it prints as one line."""


def _option(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclasses.dataclass(frozen=True)
class PrefillExtConfig:
    eviction: str | None = _option(
        None,
        "Eviction policy of the extension's prefix tree: SGLang's own (lru, lfu, fifo, mru, filo, "
        "priority, slru), 'cost' (least expected recompute cost per slot: log-damped hits over idle "
        "time, times a per-token cost growing with depth) or 'reuse' (the leaf predicted to be reused "
        "last, from each node's reuse interval while intervals repeat, else least recently used; only "
        "the tail still needed is taken from the last leaf). Unset: SGLang's --radix-eviction-policy "
        "(lru by default).",
        EVICTION_POLICIES,
    )
    sparse: bool = _option(
        False,
        "Block-sparse attention (FlashInfer's kernels over the KV pool) for long extend batches, on the "
        "flashinfer or fa3 attention backend; decode and short prompts keep the backend's own attention.",
    )
    sparse_scorer: str = _option(
        SPARSE.scorer,
        "How key blocks are chosen: 'pooled' (mean query . mean key per block pair against "
        "--prefill-ext-sparse-threshold), 'sampled' (a few exact query rows per query block and head attend "
        "over all keys; blocks are kept, largest first, until they hold --prefill-ext-sparse-mass of the "
        "row's attention: finds single-token needles a block mean dilutes), 'hybrid' (either keeps it).",
        SCORERS,
    )
    sparse_mass: float = _option(
        SPARSE.mass,
        "Sampled scorer: keep the fewest, largest key blocks holding this fraction of each query block's "
        "estimated attention (mean over the KV head's query heads and the sampled rows); 1 keeps them all.",
    )
    sparse_samples: int = _option(
        SPARSE.samples,
        "Sampled scorer: query rows sampled per query block (the last, then evenly back to the first).",
    )
    sparse_threshold: float = _option(
        SPARSE.threshold,
        "Pooled scorer: keep a key block when its estimated attention weight (from pooled Q/K) is at least "
        "this fraction of the row's best block, for any query head of the KV head's group; 0 keeps every block.",
    )
    sparse_min_len: int = _option(
        32768,
        "Sparse only for extend batches whose longest request (prefix + new tokens) has this many tokens.",
    )
    sparse_min_extend: int = _option(
        1024,
        "Sparse only when a request at or over --prefill-ext-sparse-min-len also brings this many new "
        "tokens in the batch: a cache hit or a short follow-up over a long prefix stays dense (for so few "
        "queries dense attention is cheaper than selecting and planning).",
    )
    sparse_max_density: float = _option(
        0.6,
        "When the first sparse layer's layout keeps more than this fraction of its causal key blocks, the "
        "batch declines: that layer and the later ones run the attention backend's own dense prefill "
        "(FlashInfer's block-sparse kernel costs about 1.3 x density of a dense pass on the H200, so a denser "
        "layout would not pay); 1 keeps every layout sparse.",
    )
    sparse_dense_layers: int = _option(2, "The first N layers always run dense attention.")
    sparse_block_size: int = _option(SPARSE.block_size, "Tokens per query/key block of the sparse layout.")
    sparse_sink_blocks: int = _option(
        SPARSE.sink_blocks, "Leading key blocks every query block keeps (attention sinks)."
    )
    sparse_local_blocks: int = _option(
        SPARSE.local_blocks,
        "Key blocks right before and including the diagonal that every query block keeps (local window).",
    )
    sparse_last_blocks: int = _option(
        SPARSE.last_blocks,
        "The last N query blocks of each request's extend attend densely (e.g. the question at the end).",
    )
    sparse_per_query_head: bool = _option(
        SPARSE.per_query_head,
        "Select key blocks per query head (each query head its own sampled mass and pooled score, one query "
        "head per FlashInfer segment) instead of one set per KV head shared by its query heads.",
    )
    sparse_per_layer: bool = _option(
        True,
        "Score and plan in every sparse layer (on SmolLM2 a layout shared by all layers keeps less of the "
        "attention at a higher density); off: score once at the first sparse layer, one plan per forward.",
    )
    schedule: str = _option(
        "auto",
        "Prefill queue order: 'lpm-aging' (longest cached prefix first, a request re-matched only when the "
        "node its match ends at got a new child or the tree evicted, no queue-length cutoff, requests "
        "waiting --prefill-ext-max-wait-passes passes go first), 'stock' (SGLang's --schedule-policy), or 'auto' (lpm-aging when --schedule-policy is "
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
    protect_waiting: bool = _option(
        True,
        "Each pass, mark the cached prefix every waiting request matches as used, the queue's head last, "
        "so eviction takes the prefixes of the requests the scheduler reaches last instead of the queue "
        "head's (which, having waited longest, LRU would evict first).",
    )
    chunk_align_tail: float = _option(
        0.25,
        "A chunked prompt's chunk ends on a page boundary and, when a waiting request's prompt stops "
        "sharing it within this last fraction of the chunk, at that divergence point, so the landed chunk "
        "is the node the waiting request matches (0: page boundaries only).",
    )
    decode_adaptive_budget: int = _option(
        0,
        "With more than N requests decoding, a pass's prefill chunk shrinks to --chunked-prefill-size x N / "
        "decoding (page-aligned, at least --prefill-ext-decode-budget-min-tokens), bounding how long a prefill "
        "pass stalls decoding; 0: always --chunked-prefill-size (SGLang's behaviour).",
    )
    decode_budget_min_tokens: int = _option(
        1024,
        "--prefill-ext-decode-adaptive-budget never shrinks a pass's prefill chunk below this many tokens.",
    )
    max_wait_passes: int = _option(
        32, "lpm-aging: a request that has waited this many scheduling passes is ordered first (FCFS)."
    )
    pass_budget_ms: float = _option(
        0.0,
        "Short requests first: while short requests arrive (one seen within --prefill-ext-short-window-s), "
        "every prefill pass is sized to this predicted forward time (--prefill-ext-pass-cost); waiting short "
        "requests go ahead of longer ones and ride the next pass (as many as fit in the budget, at least one), "
        "and a long prompt's chunk takes the rest of the budget (at least --prefill-ext-min-long-chunk "
        "tokens). 0: off (SGLang's chunk size every pass).",
    )
    short_max_tokens: int = _option(
        4096, "Short requests first: a waiting request with at most this many uncached tokens is short."
    )
    short_window_s: float = _option(
        1.0,
        "Short requests first: passes stay budgeted this long after the last short request was seen; a "
        "negative value budgets every pass (Sarathi-style).",
    )
    min_long_chunk: int = _option(
        512,
        "Short requests first: a budgeted pass never shrinks a long prompt's chunk below this many tokens, "
        "so long prompts keep progressing.",
    )
    pass_cost: str = _option(
        "5,22,890",
        "Forward-time model of a prefill pass, FIXED_MS,TOKEN_US,PAIR_PS: a fixed cost, a cost per new token "
        "and per (new token, context token) pair of causal attention; defaults fitted on the H200 "
        "(8B-shaped model, fa3).",
    )

    log: str = _option(
        "",
        "Append one JSON line per finished request to this file: rid, input_len, cached_tokens, "
        "deduped_tokens, chunks, queue_passes, budgeted_chunks, queue_ms, prefill_ms, ttft_ms, "
        "output_tokens, error (empty: off).",
    )
    pass_log: str = _option(
        "",
        "Append one JSON line per prefill pass to this file: its time, waiting and short requests, the "
        "chunk budget and, per admitted request, new and cached tokens and whether it is chunked (empty: off).",
    )

    def tree_eviction(self, sglang_policy: str) -> str:
        """The tree's policy: this option when given, else a non-default `--radix-eviction-policy`,
        else DEFAULT_EVICTION (pass `--prefill-ext-eviction lru` for LRU)."""
        if self.eviction is not None:
            return self.eviction
        sglang_policy = sglang_policy.lower()
        return DEFAULT_EVICTION if sglang_policy == SGLANG_DEFAULT_EVICTION else sglang_policy

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> PrefillExtConfig:
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionError(f"unknown prefill-ext options: {', '.join(unknown)}")
        config = cls(**options)
        try:
            PassCost.parse(config.pass_cost)
        except ValueError as error:  # one line at launch, as every refused option
            raise OptionError(str(error)) from None
        for f in dataclasses.fields(cls):
            choices = f.metadata["choices"]
            value = getattr(config, f.name)
            if choices and value is not None and value not in choices:
                raise OptionError(
                    f"--prefill-ext-{f.name.replace('_', '-')}={value!r}: choose from {choices}"
                )
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


def _cli_kwargs(field: dataclasses.Field) -> dict[str, Any]:
    """argparse keywords by the field's default: bools read as switches with an optional value."""
    default = field.default
    if isinstance(default, bool):
        return {"nargs": "?", "const": True, "type": _parse_bool, "metavar": "BOOL"}
    if field.metadata["choices"]:
        return {"type": str, "choices": field.metadata["choices"]}
    if isinstance(default, (int, float)):
        return {"type": type(default), "metavar": type(default).__name__.upper()}
    return {"type": str, "metavar": "TEXT"}


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return lowered in ("1", "true", "yes", "on")


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
        shown_default = "unset" if f.default is None else f.default
        group.add_argument(
            f"--prefill-ext-{f.name.replace('_', '-')}",
            dest=f"_prefill_ext_{f.name}",
            action=_StoreOption,
            option_name=f.name,
            default=argparse.SUPPRESS,
            help=f"{f.metadata['help']} (default: {shown_default})",
            **_cli_kwargs(f),
        )
