"""The sparse policy's knobs, free of any serving framework: which layers go sparse, what the selection
keeps, when a batch is declined, and how often a forward selects and plans."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

SCORERS = ("hybrid", "sampled", "pooled", "antidiagonal")
GUARD_QUANTILE = 0.01  # the guard's statistic: this low quantile of the sampled rows' kept shares (guard.py)


def _setting(default: object, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A field with the text a command line shows for it (`help`, and its `choices` if any)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    """Block-selection rule.

    A query block keeps a key block when it is causal (not after the diagonal) and any of:
    a sink (one of the first `sink_blocks`), inside the local window (`local_blocks` ending at the
    diagonal), the diagonal itself, the query block is one of the prompt's last `last_blocks`, or the
    scorer picks it. Scorer "sampled": the block is among the fewest, largest blocks holding the mass
    fraction (`mass`, lowered by `mass_decay` per doubling of the whole prompt beyond `mass_len`) of
    the row's attention as estimated from `samples` exact query rows per block and head (scorers/sampled.py).
    Scorer "antidiagonal": the same rule on the mass estimated from antidiagonal sums of `stride` x
    `stride` tiles of QK^T (scorers/antidiagonal.py). `layer_mass` and `layer_stride` set the mass and the
    stride of named layers (`at_layer`).
    Scorer "pooled": its pooled score reaches `threshold` x the row's best for some query head of the
    KV head's group. Scorer "hybrid": either rule keeps it. With `per_query_head` every query head
    gets its own blocks (its own sampled mass, its own pooled score) instead of one set per KV head.
    """

    block_size: int = _setting(128, "Tokens per query/key block of the sparse layout.")
    scorer: str = _setting(
        "antidiagonal",
        "Which key blocks a query block keeps besides sinks, local window and last rows: pooled (the "
        "dot product of mean query and mean key per block pair, within --prefill-ext-sparse-threshold of "
        "the row's best), sampled (--prefill-ext-sparse-samples exact query rows per block and head attend "
        "over all keys; the fewest, largest blocks holding --prefill-ext-sparse-mass of their attention: "
        "finds single-token needles a block mean dilutes), hybrid (either keeps it) or antidiagonal (every "
        "query row, at 1/--prefill-ext-sparse-stride of QK^T: the sums of the antidiagonals of stride x stride "
        "tiles, softmaxed; the fewest, largest blocks holding --prefill-ext-sparse-mass of that estimate).",
        SCORERS,
    )
    mass: float = _setting(
        0.9,
        "Sampled and antidiagonal scorers: the fraction of each query block's estimated attention (per query "
        "head, or the mean over its KV head's query heads) the kept blocks must hold, largest first, in a "
        "prompt of up to --prefill-ext-sparse-mass-len tokens (less in a longer one: "
        "--prefill-ext-sparse-mass-decay); 1 keeps them all, at every length.",
    )
    mass_decay: float = _setting(
        0.0,
        "Sampled and antidiagonal scorers: how much the mass falls per doubling of the whole prompt beyond "
        "--prefill-ext-sparse-mass-len tokens (a longer prompt keeps its accuracy at a lower "
        "mass); 0 keeps --prefill-ext-sparse-mass at every length, as does a mass of 1.",
    )
    mass_len: int = _setting(
        32768, "Sampled and antidiagonal scorers: the prompt length up to which the mass is not lowered."
    )
    layer_mass: str = _setting(
        "",
        "Sampled and antidiagonal scorers: per-layer masses, comma-separated A-B=X: the model's layers A..B "
        "(from 0, inclusive) select at mass X instead of --prefill-ext-sparse-mass (the decay applies to "
        "both), e.g. 7-20=0.97; a layer past the model's last is never reached. Needs "
        "--prefill-ext-sparse-per-layer. Empty: every layer at --prefill-ext-sparse-mass.",
    )
    samples: int = _setting(
        2,
        "Sampled scorer and guard: query rows sampled per query block (its last, then evenly back to its first).",
    )
    stride: int = _setting(
        4,
        "Antidiagonal scorer: query and key positions packed per antidiagonal (a power of two dividing the "
        "block size); the scoring matmul costs 1/stride of QK^T. 4 is the dev split's pick over 8 and 16 "
        "(bench/results/2026-12-07-h100-sparse-stride-served.md).",
    )
    layer_stride: str = _setting(
        "",
        "Antidiagonal scorer: per-layer strides, comma-separated A-B=S: the model's layers A..B (from 0, "
        "inclusive) score at stride S (a power of two dividing the block size) instead of "
        "--prefill-ext-sparse-stride, e.g. 7-20=4 over a stride of 16: the finer, costlier estimate only in the "
        "layers whose selection needs it (not measured on a GPU yet); a layer past the model's last is never "
        "reached. Needs --prefill-ext-sparse-per-layer. Empty: every layer at --prefill-ext-sparse-stride.",
    )
    threshold: float = _setting(
        0.003,
        "Pooled scorer: keep a key block whose attention estimate from pooled Q/K reaches this fraction of "
        "the row's best block, for any query head of the KV head's group; 0 keeps every block.",
    )
    sink_blocks: int = _setting(1, "Leading key blocks every query block keeps (attention sinks).")
    local_blocks: int = _setting(
        4, "Key blocks up to and including the diagonal that every query block keeps (local window)."
    )
    last_blocks: int = _setting(
        4,
        "The last N query blocks of each prompt attend densely (e.g. the question at the end), in the forward "
        "holding the prompt's end; the chunks before it have none. Blocks sit at absolute positions, so the "
        "last one may hold a single token: N blocks are at least (N - 1) x --prefill-ext-sparse-block-size rows.",
    )
    per_query_head: bool = _setting(
        True,
        "Select key blocks per query head (each query head its own sampled mass and pooled score, one query "
        "head per FlashInfer segment) instead of one set per KV head shared by its query heads.",
    )
    guard: float = _setting(
        0.0,
        "Decline a batch whose selection drops attention that sampled rows need: at a checked layer (the first "
        "sparse layer, and every --prefill-ext-sparse-guard-every-th after it), --prefill-ext-sparse-samples "
        "query rows per query block attend exactly over all their keys; when the "
        f"{GUARD_QUANTILE:g} quantile, over every query head and sampled row, of the share of that attention "
        "in the layer's kept blocks is under this bound, that layer and every later one run the backend's dense "
        "prefill (as --prefill-ext-sparse-max-density declines). A row the selection reads right holds about "
        "--prefill-ext-sparse-mass (after its decay) or more, so a useful bound lies below it. Cost per checked "
        "layer: about samples / block_size of its dense QK^T (the sampled rows' logits, no PV) and one host "
        "read-back. 0: off, nothing computed.",
    )
    guard_every: int = _setting(
        0,
        "With --prefill-ext-sparse-guard: also check every N-th sparse layer after the first (a decline there "
        "leaves the layers before it sparse; each check costs what the first does); 0: the first sparse layer only.",
    )
    dense_layers: int = _setting(0, "The first N layers always run dense attention.")
    max_density: float = _setting(
        0.6,
        "A batch whose first sparse layer selects more than this fraction of its causal key blocks is "
        "declined: that layer (its K/V already written) and every later one run the backend's own dense "
        "prefill, as stock does. FlashInfer's block-sparse kernel costs about 1.3 x density of a dense pass "
        "on the H200, so a denser selection would not pay; 1 keeps every batch sparse.",
    )
    per_layer: bool = _setting(
        True,
        "Select and plan in every sparse layer; false: once per forward at the first sparse layer, shared "
        "by the rest.",
    )
    plan_once: bool = _setting(
        True,
        "Plan FlashInfer once per forward, at its first sparse layer; every later layer writes only its kept "
        "blocks' indices and KV ranges, on the device (no host step per layer; fa3's plan has its work items' "
        "KV ranges rewritten, fa2's is made with the KV split off). False: every layer plans (a host step each).",
    )

    def __post_init__(self) -> None:
        if not _power_of_two(self.block_size):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {self.scorer!r}")
        if not 0.0 <= self.mass <= 1.0:
            raise ValueError(f"mass must lie in [0, 1], got {self.mass}")
        if self.mass_decay < 0 or self.mass_len < 1:
            raise ValueError(
                f"mass_decay must be >= 0 and mass_len >= 1, got {self.mass_decay}, {self.mass_len}"
            )
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        layer_strides = parse_layer_stride(self.layer_stride)
        for stride in (self.stride, *(stride for _, stride in layer_strides)):
            if not _power_of_two(stride):
                raise ValueError(f"stride must be a power of two, got {stride}")
            if self.scorer == "antidiagonal" and self.block_size % stride:
                raise ValueError(f"stride {stride} must divide block_size {self.block_size}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold}")
        if not 0.0 <= self.guard <= 1.0:
            raise ValueError(f"guard must lie in [0, 1], got {self.guard}")
        if self.guard_every < 0:
            raise ValueError(f"guard_every must be >= 0, got {self.guard_every}")
        if not 0.0 <= self.max_density <= 1.0:
            raise ValueError(f"max_density must lie in [0, 1], got {self.max_density}")
        if self.dense_layers < 0:
            raise ValueError(f"dense_layers must be >= 0, got {self.dense_layers}")
        if min(self.sink_blocks, self.local_blocks, self.last_blocks) < 0:
            raise ValueError("sink_blocks, local_blocks and last_blocks must be >= 0")
        layer_values = {"layer_mass": parse_layer_mass(self.layer_mass), "layer_stride": layer_strides}
        for name, pairs in layer_values.items():
            if pairs and not self.per_layer:
                raise ValueError(f"{name} needs per_layer: a shared selection is made at one layer")

    def at_layer(self, layer: int | None) -> SparseSettings:
        """The settings model layer `layer` selects with: its `layer_mass` mass and its `layer_stride`
        stride where a range names it, else these settings' (None: these settings)."""
        if layer is None or not (self.layer_mass or self.layer_stride):
            return self
        mass = _value_at(parse_layer_mass(self.layer_mass), layer, self.mass)
        stride = _value_at(parse_layer_stride(self.layer_stride), layer, self.stride)
        return dataclasses.replace(self, mass=mass, stride=stride, layer_mass="", layer_stride="")

    @property
    def log_threshold(self) -> float:
        """The threshold as a logit margin below the row's best (-inf keeps every block)."""
        return math.log(self.threshold) if self.threshold > 0 else -math.inf


def _power_of_two(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def _mass(text: str) -> float:
    """A `layer_mass` value: a mass in [0, 1] (ValueError: not one)."""
    try:
        mass = float(text)
    except ValueError:
        mass = math.nan
    if not 0.0 <= mass <= 1.0:
        raise ValueError("needs a mass in [0, 1]")
    return mass


def _stride(text: str) -> int:
    """A `layer_stride` value: a power of two (whether it divides the block size is `SparseSettings`' check)."""
    if not (text.isdigit() and _power_of_two(int(text))):
        raise ValueError("needs a stride that is a power of two")
    return int(text)


Value = TypeVar("Value", int, float)


@functools.lru_cache(maxsize=64)
def parse_layer_values(
    text: str, name: str, check: Callable[[str], Value]
) -> tuple[tuple[range, Value], ...]:
    """The per-layer text of field `name` (`A-B=V,...`) as (layers A..B, value V) pairs, V as `check` reads it
    (ValueError: not a valid value); ValueError names what is wrong."""
    pairs: list[tuple[range, Value]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        layers, equals, value = item.partition("=")
        first, _, last = layers.partition("-")
        try:
            ranged = range(int(first), int(last) + 1)
        except ValueError:
            ranged = None
        if ranged is None or not equals:
            raise ValueError(f"{name}: expected A-B=V (layers A..B at value V), got {item!r}")
        if not ranged or ranged.start < 0:
            raise ValueError(f"{name}: {item!r} needs 0 <= A <= B")
        try:
            checked = check(value)
        except ValueError as error:
            raise ValueError(f"{name}: {item!r} {error}") from None
        if any(set(ranged) & set(other) for other, _ in pairs):
            raise ValueError(f"{name}: {item!r} overlaps an earlier range")
        pairs.append((ranged, checked))
    return tuple(pairs)


def parse_layer_mass(text: str) -> tuple[tuple[range, float], ...]:
    """`layer_mass` text (`A-B=X,...`) as (layers A..B, mass X) pairs; ValueError names what is wrong."""
    return parse_layer_values(text, "layer_mass", _mass)


def parse_layer_stride(text: str) -> tuple[tuple[range, int], ...]:
    """`layer_stride` text (`A-B=S,...`) as (layers A..B, stride S) pairs; ValueError names what is wrong."""
    return parse_layer_values(text, "layer_stride", _stride)


def _value_at(pairs: tuple[tuple[range, Value], ...], layer: int, default: Value) -> Value:
    """The value of the range of `pairs` that holds `layer`, else `default`."""
    return next((value for layers, value in pairs if layer in layers), default)
