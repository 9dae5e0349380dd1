"""Accuracy of block-sparse prefill on real weights, against dense and against the text itself.

    python -m bench.accuracy.sparse_accuracy --model-dir DIR [--prompts 8] [--length 8192] [--json PATH]
        [--configs SCORER:VALUE[@OPT,...] ...] [--samples 2] [--local-blocks 4] [--dense-layers 2]
        [--block-size 128] [--shared] [--max-density 1] [--guard 0] [--guard-every 0] [--device cuda|cpu]
        [--emulate] [--tf32]

Loads an HF checkpoint (Qwen2.5-Coder-1.5B-Instruct or SmolLM2-135M, scripts/models/model_parts.py) with
transformers and runs each prompt of `--length` tokens of real text (`bench/lib/real_text.py`) dense (torch SDPA,
causal), then once per config with every layer from `--dense-layers` on attending through the policy the
server runs (`SparsePrefill.attend`: one KV pool slot per position, selection and plan in every sparse
layer, or with --shared once at the first; a first selection denser than --max-density declines the forward,
which then runs dense, and so does a layer whose selection fails --guard, `SparseSettings.guard`). With --emulate
the model runs in fp32 and every layer, dense reference included, through exact attention a chunk of queries at
a time (ops/exact.py: nothing is L x L), the sparse layers over their kept blocks only (`EmulatedPrefill`: the
same policy, --max-density included, with exact attention in place of FlashInfer's): only the selection differs from dense (--tf32: TF32 matmuls in that attention,
for 128K in minutes; dense and sparse share the rounding).

Logits are computed from the final hidden states a chunk of positions at a time (128K x vocab never exists).
Reports per config, over every position and past the first 1,024: perplexity of the text and accuracy of the
argmax against the text's real next token (dense's own beside it), top-1 agreement with dense, mean KL(dense ||
sparse), the kept-block density (kept causal blocks over causal blocks, mean over the selecting layers; the
JSON has it per layer and per mask head), the forwards declined and, with --guard, the guard statistic (ops/guard.py:
the mean over prompts of each forward's lowest, and the lowest; the JSON has it per checked layer).

SCORER:VALUE: sampled:MASS, pooled:THRESHOLD, hybrid:THRESHOLD,MASS, antidiagonal:MASS, and oracle:MASS, which
keeps, per head and query block, the fewest blocks holding MASS of the layer's exact attention (plus sinks, local
window, last rows): what a perfect scorer would keep, a bound on any selection at that density (with --emulate in
fp32, selected and attended in one pass over the scores; else in bf16, `OraclePrefill`: the exact mass from a
Triton kernel, FlashInfer's attention over the kept blocks, CUDA only). OPT (comma-separated): `q` one selection per query head instead of per KV head; `LA-B` only
layers A..B go sparse, the others dense (where the loss is: swap sparse in one range at a time); `MA-B=X`
layers A..B select at mass X (a per-layer budget); `SA-B=S` layers A..B score at antidiagonal stride S (a
per-layer stride); `bN` N-token blocks instead of --block-size; `sN` N sampled
rows per block instead of --samples; `xN` antidiagonal stride N; `dX` the mass lowered by X per doubling of the
prompt beyond `SparseSettings.mass_len` instead of the server's `mass_decay` (d0: MASS at every length);
`layer` (oracle) MASS of the whole layer's attention per head instead of per query block (rows that attend
narrowly give their budget to rows that spread).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.accuracy import corpora
from bench.accuracy.corpora import CORPORA
from bench.lib.real_text import corpus_ids
from sglang_prefill_ext.ops import BlockLayout, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.attention import BlockSparseAttention
from sglang_prefill_ext.ops.exact import (
    block_sparse_attention,
    exact_block_mass,
    exact_block_mass_triton,
    selected_attention,
)
from sglang_prefill_ext.ops.selection import largest_holding, mass_fraction, select_by_mass, structural_blocks
from sglang_prefill_ext.ops.settings import parse_layer_mass, parse_layer_stride

TAIL_FROM = 1024
LOGIT_ROWS = 4096  # positions per lm_head chunk: 4096 x 152K vocab fp32 is 2.5 GB


def token_major(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """transformers' [1, H, L, D] -> [L, H, D]."""
    assert all(t.shape[0] == 1 for t in tensors), "one prompt per forward"
    return [t[0].transpose(0, 1).contiguous() for t in tensors]


def exact_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function: exact fp32 causal attention, a chunk of queries at a time
    (the fp32 math SDPA kernel would hold L x L: 144 GiB at 64K)."""
    out = block_sparse_attention(*token_major(query, key, value), scaling)
    return out.to(query.dtype).unsqueeze(0), None


@dataclasses.dataclass(frozen=True)
class Oracle:
    """Selection from the exact attention: `per_layer` MASS of the layer's whole attention per head, else of
    each query block's."""

    per_layer: bool = False

    def select(self, mass: torch.Tensor, layout: BlockLayout, settings: SparseSettings) -> torch.Tensor:
        """The kept blocks from the exact block mass (`exact_block_mass`'s sums)."""
        return (select_by_layer_mass if self.per_layer else select_by_mass)(mass, layout, settings)


def select_by_layer_mass(mass: torch.Tensor, layout: BlockLayout, settings: SparseSettings) -> torch.Tensor:
    """Per head, the fewest (query block, key block) pairs holding `settings.mass` of the layer's whole
    attention (largest first), plus the structural blocks: bool [H, R, C]."""
    chosen = largest_holding(mass.flatten(1), mass_fraction(layout.req_prompt_len[:1], settings)).view_as(
        mass
    )
    return chosen | structural_blocks(layout, settings, mass.device)[None]


def rows_by_mass(
    layout: BlockLayout, settings: SparseSettings
) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """`select_by_mass`'s rule (its torch twin) for a slice of rows: `(first_row, mass [H, r, C]) -> bool [H, r,
    C]`, what `selected_attention` chooses with."""
    structural = structural_blocks(layout, settings, layout.row_block.device)
    cols = torch.arange(structural.shape[1], device=structural.device)
    causal = cols[None, :] <= layout.row_block.long().to(structural.device)[:, None]
    fraction = mass_fraction(layout.req_prompt_len[:1], settings).to(structural.device)

    def choose(first: int, mass: torch.Tensor) -> torch.Tensor:
        rows = slice(first, first + mass.shape[1])
        if settings.mass >= 1.0:
            return causal[rows][None].expand_as(mass).clone()
        return largest_holding(mass, fraction) | structural[rows][None]

    return choose


class EmulatedPrefill(SparsePrefill):
    """The serving policy with FlashInfer swapped out: planning keeps the mask, and running is exact fp32
    attention over its kept blocks (`block_sparse_attention`), so only the selection differs from dense;
    `oracle` selects from the exact attention."""

    def __init__(self, settings: SparseSettings, oracle: Oracle | None = None) -> None:
        super().__init__(settings, None)
        self.oracle = oracle
        self._sm_scale = 1.0
        self._values: torch.Tensor | None = None
        self._selected: tuple[torch.Tensor, torch.Tensor] | None = None  # (q, its output) from `select`

    def attend(
        self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor | None:
        self._values = v_buffer  # the per-block oracle attends in the pass that selects (`select`)
        return super().attend(q, k_buffer, v_buffer, *args, **kwargs)

    def select(
        self, q: torch.Tensor, k_buffer: torch.Tensor, sm_scale: float, layer: int | None = None
    ) -> torch.Tensor:
        self._selected = None
        if self.oracle is None:
            return super().select(q, k_buffer, sm_scale, layer)
        settings = self.settings.at_layer(layer)
        if self.oracle.per_layer:
            mass = exact_block_mass(
                q, k_buffer, sm_scale, settings.block_size, per_query_head=settings.per_query_head
            )
            return self.oracle.select(mass, self.layout, settings)
        out, mask = selected_attention(
            q,
            k_buffer,
            self._values,
            sm_scale,
            rows_by_mass(self.layout, settings),
            settings.block_size,
            per_query_head=settings.per_query_head,
        )
        self._selected = (q, out)
        return mask

    def plan(self, mask: torch.Tensor, q: torch.Tensor, sm_scale: float, *_: object, **__: object) -> None:
        """Keep the mask, and the scale `run` attends with: no FlashInfer plan."""
        self.mask, self._sm_scale, self.planned = mask, sm_scale, True

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        if self._selected is not None and self._selected[0] is q:
            return self._selected[1].to(q.dtype)
        out = block_sparse_attention(
            q, k_buffer, v_buffer, self._sm_scale, self.mask, self.settings.block_size
        )
        return out.to(q.dtype)


class OraclePrefill(SparsePrefill):
    """The serving policy, FlashInfer's attention over the kept blocks in bf16, selecting from the exact
    attention (`exact_block_mass_triton`): the oracle on the server's numerics, at about two QK^T passes a
    layer (the fp32 emulation materializes every score: ~3x dense's time)."""

    def __init__(self, settings: SparseSettings, attention: Any, oracle: Oracle = Oracle()) -> None:
        super().__init__(settings, attention)
        self.oracle = oracle

    def select(
        self, q: torch.Tensor, k_buffer: torch.Tensor, sm_scale: float, layer: int | None = None
    ) -> torch.Tensor:
        settings = self.settings.at_layer(layer)
        keys = k_buffer[self._locs]
        mass = exact_block_mass_triton(q, keys, sm_scale, settings.block_size, settings.per_query_head)
        return self.oracle.select(mass, self.layout, settings)


class SparseAttention:
    """A transformers attention function running the serving policy (`SparsePrefill.attend`: dense layers,
    selection, per-layer reuse, decline) over one prompt; where it returns None the layer runs dense
    (exact chunked attention with `emulate`, an `EmulatedPrefill`, else SDPA)."""

    def __init__(self, sparse: SparsePrefill, emulate: bool, sparse_layers: range | None = None) -> None:
        self.sparse = sparse
        self.emulate = emulate
        self.sparse_layers = sparse_layers  # None: every layer the policy takes; else only these go sparse
        self.densities: list[dict[int, list[float]]] = []  # per forward: selecting layer -> per mask head
        self.guards: list[dict[int, float]] = []  # per forward: checked sparse layer -> guard statistic

    @property
    def declined(self) -> bool:
        """Whether the last forward was declined (ran dense from the layer that declined it)."""
        return self.sparse.declined

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        layer = module.layer_idx
        q, k, v = token_major(query, key, value)
        if layer == 0:
            length = q.shape[0]
            layout = BlockLayout.build([0], [length], self.sparse.settings.block_size, q.device)
            self.sparse.begin(layout, torch.arange(length, device=q.device))
            self.densities.append({})
            self.guards.append({})
        skipped = self.sparse_layers is not None and layer not in self.sparse_layers
        selects = not skipped and self.sparse.takes(layer) and self.sparse.selects()
        out = None if skipped else self.sparse.attend(q, k, v, scaling, layer=layer)
        if selects:
            self.densities[-1][layer] = self.sparse.head_densities().tolist()
        index = self.sparse.sparse_index(layer)
        if index in self.sparse.guard_stats:
            self.guards[-1][layer] = self.sparse.guard_stats[index]
        if out is None:  # a dense layer, or declined: this layer and the later ones run dense
            dense = exact_attention if self.emulate else sdpa_attention_forward
            return dense(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
        return out.unsqueeze(0), None


class TextScores:
    """Next-token scores of one forward's final hidden states [L, H] against the text (ids [L]) and,
    for a sparse forward, against dense's hidden states: computed LOGIT_ROWS positions at a time."""

    def __init__(self, lm_head: torch.nn.Module, ids: torch.Tensor) -> None:
        self.lm_head = lm_head
        self.ids = ids

    def _chunks(self, hidden: torch.Tensor):
        for start in range(0, hidden.shape[0] - 1, LOGIT_ROWS):
            end = min(start + LOGIT_ROWS, hidden.shape[0] - 1)  # the last position has no next token
            yield start, end, self.lm_head(hidden[start:end]).float().log_softmax(-1)

    def score(self, hidden: torch.Tensor, dense: torch.Tensor | None = None) -> dict[str, float]:
        nll, right, agree, kl = [], [], [], []
        dense_chunks = self._chunks(dense) if dense is not None else None
        for start, end, logp in self._chunks(hidden):
            target = self.ids[start + 1 : end + 1]
            nll.append(-logp.gather(-1, target[:, None])[:, 0])
            best = logp.argmax(-1)
            right.append(best == target)
            if dense_chunks is not None:
                _, _, dense_logp = next(dense_chunks)
                agree.append(best == dense_logp.argmax(-1))
                kl.append(F.kl_div(logp, dense_logp, log_target=True, reduction="none").sum(-1))
        nll_all, right_all = torch.cat(nll), torch.cat(right).float()
        out = dict(
            ppl=math.exp(float(nll_all.mean())),
            ppl_tail=math.exp(float(nll_all[TAIL_FROM:].mean())),
            next_acc=float(right_all.mean()),
            next_acc_tail=float(right_all[TAIL_FROM:].mean()),
        )
        if agree:
            agree_all, kl_all = torch.cat(agree).float(), torch.cat(kl)
            out.update(
                top1=float(agree_all.mean()),
                top1_tail=float(agree_all[TAIL_FROM:].mean()),
                kl=float(kl_all.mean()),
                kl_tail=float(kl_all[TAIL_FROM:].mean()),
                kl_max=float(kl_all.max()),
            )
        return out


def density_summary(forwards: list[dict[int, list[float]]]) -> dict[str, object]:
    """Kept causal blocks over causal blocks: per (selecting) layer and mask head (KV or query head),
    mean over prompts; per layer the mean over its heads; overall the mean over layers."""
    per_head = {
        layer: [statistics.mean(f[layer][h] for f in forwards) for h in range(len(heads))]
        for layer, heads in forwards[0].items()
    }
    per_layer = {layer: statistics.mean(heads) for layer, heads in per_head.items()}
    return dict(
        density=statistics.mean(per_layer.values()), density_per_layer=per_layer, density_per_head=per_head
    )


def guard_summary(forwards: list[dict[int, float]]) -> dict[str, object]:
    """The guard statistic (ops/guard.py) of the checked layers: the mean over prompts of each forward's
    lowest, the lowest of all, and per layer the mean over the forwards that reached it; empty when off."""
    if not any(forwards):
        return {}
    lowest = [min(f.values()) for f in forwards]
    layers = sorted({layer for f in forwards for layer in f})
    per_layer = {layer: statistics.mean(f[layer] for f in forwards if layer in f) for layer in layers}
    return dict(guard=statistics.mean(lowest), guard_min=min(lowest), guard_per_layer=per_layer)


SCORER_VALUES = {
    "sampled": "MASS",
    "pooled": "THRESHOLD",
    "hybrid": "THRESHOLD,MASS",
    "antidiagonal": "MASS",
    "oracle": "MASS",  # the fewest blocks holding MASS of the exact attention (a bound)
}
SINGLE_KNOB = {"sampled": "mass", "pooled": "threshold", "antidiagonal": "mass", "oracle": "mass"}


NUMBERED_OPTS = {"b": "block_size", "s": "samples", "x": "stride"}
OPTS = "q, bN, sN, xN, dX, LA-B, MA-B=X, SA-B=S, layer for oracle"
# the per-layer options: their letter -> the SparseSettings field they add ranges to, and its parser
PER_LAYER_OPTS: dict[str, tuple[str, Callable[[str], tuple[tuple[range, Any], ...]]]] = {
    "M": ("layer_mass", parse_layer_mass),
    "S": ("layer_stride", parse_layer_stride),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """One `SCORER:VALUE[@OPT,...]` argument (see the module's docstring)."""

    text: str
    scorer: str
    value: str
    per_query_head: bool = False
    block_size: int | None = None
    whole_layer: bool = False  # oracle: MASS of the whole layer's attention per head
    samples: int | None = None
    stride: int | None = None
    mass_decay: float | None = None
    sparse_layers: range | None = None
    layer_mass: str = ""  # SparseSettings.layer_mass, from the `MA-B=X` options
    layer_stride: str = ""  # SparseSettings.layer_stride, from the `SA-B=S` options

    def settings(self, block_size: int, samples: int, local_blocks: int) -> SparseSettings:
        return SparseSettings(
            block_size=self.block_size or block_size,
            scorer="sampled" if self.scorer == "oracle" else self.scorer,
            samples=self.samples or samples,
            stride=self.stride or SparseSettings.stride,
            mass_decay=SparseSettings.mass_decay if self.mass_decay is None else self.mass_decay,
            local_blocks=local_blocks,
            per_query_head=self.per_query_head,
            layer_mass=self.layer_mass,
            layer_stride=self.layer_stride,
            **knobs(self.scorer, self.value),
        )


def default_config() -> str:
    """The server's default selection as a --configs entry."""
    s = SparseSettings()
    value = {"pooled": f"{s.threshold}", "hybrid": f"{s.threshold},{s.mass}"}.get(s.scorer, f"{s.mass}")
    return f"{s.scorer}:{value}@x{s.stride}" + (",q" if s.per_query_head else "")


def _layer_range(text: str) -> range | None:
    """`A-B` as the layers A..B (None if it is not that)."""
    first, _, last = text.partition("-")
    return range(int(first), int(last) + 1) if first.isdigit() and last.isdigit() else None


def _number(text: str) -> bool:
    return text.replace(".", "", 1).isdigit()


def _per_layer_field(opt: str) -> str | None:
    """The SparseSettings field a per-layer option (`MA-B=X`, `SA-B=S`: PER_LAYER_OPTS) adds its range to;
    None if `opt` is not one."""
    field, parse = PER_LAYER_OPTS.get(opt[:1], (None, None))
    try:
        return field if parse is not None and parse(opt[1:]) else None
    except ValueError:
        return None


def parse_config(text: str) -> Config:
    spec, _, opts = text.partition("@")
    scorer, _, value = spec.partition(":")
    if scorer not in SCORER_VALUES or not value:
        expected = ", ".join(f"{sc}:{v}" for sc, v in SCORER_VALUES.items())
        raise argparse.ArgumentTypeError(f"expected one of {expected} [@{OPTS}], got {text!r}")
    fields: dict[str, object] = {}
    for opt in filter(None, opts.split(",")):
        if opt == "q":
            fields["per_query_head"] = True
        elif opt[:1] == "L" and (layers := _layer_range(opt[1:])):
            fields["sparse_layers"] = layers
        elif field := _per_layer_field(opt):
            fields[field] = ",".join(filter(None, (str(fields.get(field, "")), opt[1:])))
        elif opt == "layer" and scorer == "oracle":
            fields["whole_layer"] = True
        elif opt[:1] in NUMBERED_OPTS and opt[1:].isdigit():
            fields[NUMBERED_OPTS[opt[:1]]] = int(opt[1:])
        elif opt[:1] == "d" and _number(opt[1:]):
            fields["mass_decay"] = float(opt[1:])
        else:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown option {opt!r} ({OPTS})")
    try:
        knobs(scorer, value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {scorer} takes {SCORER_VALUES[scorer]}") from None
    return Config(text, scorer, value, **fields)  # type: ignore[arg-type]


def knobs(scorer: str, value: str) -> dict[str, float]:
    if scorer == "hybrid":
        threshold, mass = value.split(",")
        return dict(threshold=float(threshold), mass=float(mass))
    return {SINGLE_KNOB[scorer]: float(value)}


def final_hidden(model, tokens: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states [L, H] (the LM head is applied later, in chunks)."""
    return model.model(tokens).last_hidden_state[0]


def report_line(name: str, s: dict[str, float], dense: dict[str, float]) -> str:
    ppl_change = (s["ppl"] / dense["ppl"] - 1) * 100
    return (
        f"{name}: ppl {s['ppl']:.4f} ({ppl_change:+.2f} % vs dense {dense['ppl']:.4f}), next-token acc "
        f"{s['next_acc']:.4f} ({(s['next_acc'] - dense['next_acc']) * 100:+.2f} pts), top-1 vs dense "
        f"{s['top1']:.4f} (past {TAIL_FROM}: {s['top1_tail']:.4f}), mean KL {s['kl']:.3g}, max KL "
        f"{s['kl_max']:.3g}, density {s['density']:.3f}, declined {s['declined']:.0f}"
        + (f", guard {s['guard']:.3f} (lowest {s['guard_min']:.3f})" if "guard" in s else "")
    )


def policy_args(parser: argparse.ArgumentParser) -> None:
    """The model, device and sparse-policy arguments this bench and `ruler_forced` share."""
    parser.add_argument("--model-dir", required=True)
    parser.add_argument(
        "--configs", type=parse_config, nargs="+",
        default=[parse_config(default_config())],
        help="SCORER:VALUE[@OPT,...]: " + ", ".join(f"{sc}:{v}" for sc, v in SCORER_VALUES.items())
        + "; OPT: q (per query head), LA-B (only layers A..B sparse), MA-B=X (layers A..B at mass X), SA-B=S (layers "
        "A..B at stride S), bN (block size), sN (samples), xN (antidiagonal stride), dX (mass decay per doubling), "
        "layer (oracle: per-layer mass)",
    )  # fmt: skip
    parser.add_argument("--samples", type=int, default=SparseSettings.samples)
    parser.add_argument("--local-blocks", type=int, default=SparseSettings.local_blocks)
    parser.add_argument("--dense-layers", type=int, default=SparseSettings.dense_layers)
    parser.add_argument("--block-size", type=int, default=SparseSettings.block_size)
    parser.add_argument(
        "--shared", action="store_true", help="select at the first sparse layer only, share it"
    )
    parser.add_argument(
        "--max-density", type=float, default=1.0,
        help="the serving policy's decline: a first sparse selection denser than this runs the forward dense",
    )  # fmt: skip
    parser.add_argument(
        "--guard", type=float, default=SparseSettings.guard,
        help="SparseSettings.guard for every config: a checked layer whose sampled rows' low-quantile kept share "
        "is under this runs the forward dense from there; a tiny value (1e-9) reports the statistic, declining "
        "nothing",
    )  # fmt: skip
    parser.add_argument(
        "--guard-every", type=int, default=SparseSettings.guard_every,
        help="SparseSettings.guard_every: also check every N-th sparse layer after the first",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda: the package's FlashInfer sparse path in bf16; cpu: the same selection, then exact fp32 "
        "attention over the kept blocks (isolates the selection from kernel rounding)",
    )
    parser.add_argument(
        "--emulate", action="store_true", help="on cuda too: fp32 model, exact chunked attention"
    )
    parser.add_argument("--tf32", action="store_true", help="TF32 matmuls (emulated attention at 128K)")


@dataclasses.dataclass
class Loaded:
    """The model and, per config, the attention function that runs its policy (`load`)."""

    tokenizer: Any
    model: Any
    dense_attention: str  # the name of the dense attention function the model is switched back to
    attentions: dict[str, SparseAttention]
    emulate: bool


def load(a: argparse.Namespace, parser: argparse.ArgumentParser) -> Loaded:
    """Load `--model-dir` on `--device` (fp32 with exact attention when emulating) and build every config's
    policy from `policy_args`' arguments."""
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)
    emulate = a.emulate or a.device == "cpu"
    model = AutoModelForCausalLM.from_pretrained(
        a.model_dir, dtype=torch.float32 if emulate else torch.bfloat16, attn_implementation="sdpa"
    )
    model = model.to(a.device).eval()
    dense_attention = "sdpa"
    if emulate:
        AttentionInterface.register("prefill_ext_exact", exact_attention)
        dense_attention = "prefill_ext_exact"
    workspace = None if emulate else torch.empty(256 << 20, dtype=torch.uint8, device=a.device)
    attentions: dict[str, SparseAttention] = {}
    for config in a.configs:
        settings = dataclasses.replace(
            config.settings(a.block_size, a.samples, a.local_blocks),
            guard=a.guard,
            guard_every=a.guard_every,
            dense_layers=a.dense_layers,
            per_layer=not a.shared,
            max_density=a.max_density,
        )
        oracle = Oracle(per_layer=config.whole_layer) if config.scorer == "oracle" else None
        if emulate:
            sparse = EmulatedPrefill(settings, oracle)
        elif oracle is not None:
            sparse = OraclePrefill(settings, BlockSparseAttention(workspace), oracle)
        else:
            sparse = SparsePrefill.create(settings, workspace)
        attentions[config.text] = SparseAttention(sparse, emulate, config.sparse_layers)
    return Loaded(tokenizer, model, dense_attention, attentions, emulate)


def use_attention(model: Any, name: str, attention: Any = None) -> None:
    """Switch the model to attention function `name` (registering `attention` under it first, if given)."""
    from transformers import AttentionInterface

    if attention is not None:
        AttentionInterface.register(name, attention)
    model.set_attn_implementation(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    policy_args(parser)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument(
        "--corpus", choices=sorted(CORPORA), default=None,
        help="the text (bench/accuracy/corpora.py); default: bench/lib/real_text.py's standard-library modules",
    )  # fmt: skip
    a = parser.parse_args()
    loaded = load(a, parser)
    tokenizer, model, dense_attention, attentions = (
        loaded.tokenizer, loaded.model, loaded.dense_attention, loaded.attentions
    )  # fmt: skip
    if a.corpus is None:
        ids = corpus_ids(tokenizer, a.prompts * a.length)
    else:
        ids = corpora.corpus_ids(
            a.corpus,
            lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
            a.prompts * a.length,
        )
    dense_rows: list[dict[str, float]] = []
    per_config: dict[str, list[dict[str, float]]] = {c: [] for c in attentions}
    for i in range(a.prompts):
        tokens = torch.tensor([ids[i * a.length : (i + 1) * a.length]], device=a.device)
        scores = TextScores(model.lm_head, tokens[0])
        with torch.no_grad():
            use_attention(model, dense_attention)
            dense = final_hidden(model, tokens)
            dense_rows.append(scores.score(dense))
            for n, (name, attention) in enumerate(attentions.items()):
                use_attention(model, f"prefill_ext_sparse_{n}", attention)
                row = scores.score(final_hidden(model, tokens), dense)
                row["declined"] = float(attention.declined)
                per_config[name].append(row)
        print(f"prompt {i + 1}/{a.prompts} done", flush=True)
    dense_summary = {k: statistics.mean(r[k] for r in dense_rows) for k in dense_rows[0]}
    print(
        f"dense: ppl {dense_summary['ppl']:.4f} (past {TAIL_FROM}: {dense_summary['ppl_tail']:.4f}), "
        f"next-token acc {dense_summary['next_acc']:.4f}",
        flush=True,
    )
    summaries = []
    for name, rows in per_config.items():
        summary = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        summary["kl_max"] = max(r["kl_max"] for r in rows)
        summary["declined"] = sum(r["declined"] for r in rows)
        summary.update(density_summary(attentions[name].densities))
        summary.update(guard_summary(attentions[name].guards))
        summary["mass"] = float(mass_fraction(torch.tensor([a.length]), attentions[name].sparse.settings))
        summaries.append(dict(config=name, **summary))
        print(report_line(f"{name} (mass {summary['mass']:.3f})", summary, dense_summary), flush=True)
    info = dict(
        model=a.model_dir, corpus=a.corpus or "real_text", length=a.length, prompts=a.prompts, dense_layers=a.dense_layers,
        block_size=a.block_size, samples=a.samples, local_blocks=a.local_blocks, tf32=a.tf32,
        max_density=a.max_density, guard=a.guard, guard_every=a.guard_every, dense=dense_summary,
        selection="shared (first sparse layer)" if a.shared else "per layer", configs=summaries,
        device=(torch.cuda.get_device_name() if a.device == "cuda" else "cpu")
        + (" (fp32, emulated: exact chunked attention)" if loaded.emulate else " (bf16, FlashInfer block-sparse)"),
        per_prompt=dict(dense=dense_rows, **per_config),
    )  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
