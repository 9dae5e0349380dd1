"""How much of the exact attention a block selection keeps, on a real model's queries and keys (CPU or GPU).

    python -m bench.accuracy.select_fidelity --model-dir DIR [--split dev] [--first 0] [--length 8192]
        [--layers 4 10 16 22] [--scorers oracle antidiagonal] [--masses 0.7 0.8 0.9] [--stride 16] [--json PATH]

One RULER-style case of the split (`ruler.cases_of`: a haystack with every family's needles) runs once through
the model (fp32, exact attention); the queries and keys of `--layers` are kept. For each scorer and mass, the
serving selection (`SparsePrefill.select` with that scorer: its estimate, the mass rule and the structural
blocks; `oracle` ranks blocks by the exact attention instead) picks each query head's key blocks, and each
(query head, query block) is scored by the share of its exact attention the kept blocks hold. A selection that
reads the attention right keeps about the mass or more at the same density; the low quantiles show the rows
it reads wrong, the rows a retrieval head loses. Prints per layer, scorer and mass: the density, and the kept
share's mean, 1 % and 10 % quantiles over (query head, query block).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from bench.accuracy import ruler, sparse_accuracy
from bench.lib.stats import percentile
from sglang_prefill_ext.ops import BlockLayout, SparsePrefill
from sglang_prefill_ext.ops.exact import exact_block_mass
from sglang_prefill_ext.ops.selection import select_by_mass
from sglang_prefill_ext.ops.settings import SCORERS, SparseSettings

ORACLE = "oracle"  # blocks ranked by the exact attention: the bound any scorer is measured against


def capture(
    model: Any, ids: list[int], layers: set[int]
) -> dict[int, tuple[torch.Tensor, torch.Tensor, float]]:
    """One exact forward of `ids`; per layer of `layers`: its queries [L, Hq, D], keys [L, Hkv, D] (after RoPE)
    and softmax scale."""
    kept: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if module.layer_idx in layers:
            q, k = sparse_accuracy.token_major(query, key)
            kept[module.layer_idx] = q, k, scaling
            if len(kept) == len(layers):
                raise _Captured  # the layers after the last one asked are not needed
        return sparse_accuracy.exact_attention(
            module, query, key, value, attention_mask, scaling, dropout, **kwargs
        )

    sparse_accuracy.use_attention(model, "select_fidelity_capture", attention)
    with torch.no_grad(), contextlib.suppress(_Captured):
        model.model(torch.tensor([ids], device=model.lm_head.weight.device))
    return kept


class _Captured(Exception):
    """Every asked layer is captured: the forward stops there."""


@dataclasses.dataclass(frozen=True)
class Fidelity:
    layer: int
    scorer: str
    mass: float
    density: float
    kept_mean: float
    kept_p1: float
    kept_p10: float


def exact_mass(q: torch.Tensor, k: torch.Tensor, sm_scale: float, block_size: int) -> torch.Tensor:
    """One layer's exact attention per (query head, query block, key block), each row summing to 1."""
    exact = exact_block_mass(q, k, sm_scale, block_size, per_query_head=True)
    return exact / exact.sum(-1, keepdim=True)


def fidelity(
    layer: int, q: torch.Tensor, k: torch.Tensor, sm_scale: float, exact: torch.Tensor, scorer: str,
    settings: SparseSettings,
) -> Fidelity:  # fmt: skip
    """The selection of `scorer` at `settings` over one layer's queries and keys, against its `exact_mass`."""
    length = q.shape[0]
    layout = BlockLayout.build([0], [length], settings.block_size, q.device)
    if scorer != ORACLE:
        settings = dataclasses.replace(settings, scorer=scorer)
    sparse = SparsePrefill(dataclasses.replace(settings, per_query_head=True), None)
    sparse.begin(layout, torch.arange(length, device=q.device))
    mask = select_by_mass(exact, layout, settings) if scorer == ORACLE else sparse.select(q, k, sm_scale)
    kept = (exact * mask).sum(-1).flatten().tolist()
    return Fidelity(
        layer,
        scorer,
        settings.mass,
        sparse.density(mask),
        sum(kept) / len(kept),
        percentile(kept, 1) or 0.0,
        percentile(kept, 10) or 0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--first", type=int, default=0, help="the split's case")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 10, 16, 22])
    parser.add_argument("--scorers", nargs="+", default=[ORACLE, "antidiagonal"], choices=[ORACLE, *SCORERS])
    parser.add_argument("--masses", type=float, nargs="+", default=[0.7, 0.8, 0.9])
    parser.add_argument("--stride", type=int, default=SparseSettings.stride)
    parser.add_argument("--block-size", type=int, default=SparseSettings.block_size)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32).to(a.device).eval()
    ((fields, case),) = ruler.cases_of(a.split, [a.length], 1, a.first, tokenizer)
    kept = capture(model, case.context, set(a.layers))
    rows = []
    print(
        "| layer | scorer | mass | density | kept mean | kept p1 | kept p10 |\n|---:|---|---:|---:|---:|---:|---:|"
    )
    for layer in a.layers:
        q, k, scale = kept[layer]
        exact = exact_mass(q, k, scale, a.block_size)  # once per layer: every selection is held against it
        for scorer in a.scorers:
            for mass in a.masses:
                settings = SparseSettings(mass=mass, stride=a.stride, block_size=a.block_size)
                f = fidelity(layer, q, k, scale, exact, scorer, settings)
                rows.append(dataclasses.asdict(f))
                print(f"| {layer} | {scorer} | {mass:g} | {f.density:.3f} | {f.kept_mean:.3f} | {f.kept_p1:.3f} "
                      f"| {f.kept_p10:.3f} |", flush=True)  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(dict(case=fields, rows=rows), indent=1))


if __name__ == "__main__":
    main()
