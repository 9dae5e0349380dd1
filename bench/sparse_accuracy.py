"""Accuracy of block-sparse prefill on real weights: next-token predictions, sparse vs dense (issue 6).

    python bench/sparse_accuracy.py --model-dir DIR [--prompts 8] [--length 8192] [--json PATH]
        [--configs sampled:0.95 pooled:0.05 ...] [--samples 2] [--local-blocks 4] [--dense-layers 2]
        [--block-size 128] [--shared] [--device cuda|cpu] [--emulate]

Loads an HF checkpoint (SmolLM2-135M-Instruct, converted by scripts/models/convert_smollm2.py) with
transformers on the GPU and runs each prompt of `--length` tokens of real text (`real_text.py`) twice:
dense (torch SDPA, causal) and with every layer from `--dense-layers` on attending through this
package's `SparsePrefill` exactly as the serving backend runs a fresh prompt (one KV pool slot per
position, selection and plan in every sparse layer, or with --shared once at the first). With
--emulate (always on the CPU) the model runs in fp32 and every layer, dense reference included,
through exact attention a chunk of queries at a time (ops/reference.py: nothing is L x L, so 128K
fits an H200), the sparse layers over their kept blocks only: only the selection differs from dense.
Reports, over every position and over the positions past the first 1,024: top-1 agreement of the
next-token argmax, mean KL(dense || sparse) of the next-token distributions, and the kept-block density
(kept causal blocks over causal blocks: mean over the selecting layers; the JSON has it per layer and
per KV head), for every scorer:value setting given.
`oracle:MASS` (with --emulate) keeps, per KV head and query block, the fewest blocks holding MASS of the
layer's exact attention (plus sinks, local window, last rows): what a perfect scorer would keep, a bound
on any selection at that density.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from real_text import corpus_ids

from sglang_prefill_ext.ops import BlockLayout, BlockSparsePrefill, SparsePrefill, SparseSettings
from sglang_prefill_ext.ops.reference import block_sparse_attention, exact_block_mass
from sglang_prefill_ext.ops.scoring import select_by_mass

TAIL_FROM = 1024


def token_major(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """transformers' [1, H, L, D] -> [L, H, D]."""
    assert all(t.shape[0] == 1 for t in tensors), "one prompt per forward"
    return [t[0].transpose(0, 1).contiguous() for t in tensors]


def exact_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function: exact fp32 causal attention, a chunk of queries at a time
    (the fp32 math SDPA kernel would hold L x L: 144 GiB at 64K)."""
    out = block_sparse_attention(*token_major(query, key, value), scaling)
    return out.to(query.dtype).unsqueeze(0), None


class SparseAttention:
    """A transformers attention function: dense for the first layers, `SparsePrefill` for the rest.

    Emulated (fp32), every layer runs `block_sparse_attention` (the sparse ones over their kept
    blocks), so only the selection differs from dense.
    """

    def __init__(
        self,
        sparse: SparsePrefill,
        dense_layers: int,
        block_size: int,
        per_layer: bool,
        emulate: bool,
        oracle: bool = False,
    ):
        self.sparse = sparse
        self.oracle = oracle
        self.dense_layers = dense_layers
        self.block_size = block_size
        self.per_layer = per_layer
        self.emulate = emulate
        self.densities: list[dict[int, list[float]]] = []  # per forward: selecting layer -> per KV head

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if module.layer_idx < self.dense_layers:
            dense = exact_attention if self.emulate else sdpa_attention_forward
            return dense(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
        q, k, v = token_major(query, key, value)
        length = q.shape[0]
        first = module.layer_idx == self.dense_layers
        if first:
            layout = BlockLayout.build([0], [length], self.block_size, q.device)
            self.sparse.begin(layout, torch.arange(length, device=q.device))
            self.densities.append({})
        select = first or self.per_layer
        if self.emulate:
            out = self._emulate(q, k, v, scaling, select)
        else:
            out = self.sparse.forward(q, k, v, scaling, replan=self.per_layer)
        if select:
            self.densities[-1][module.layer_idx] = self.sparse.head_densities().tolist()
        return out.unsqueeze(0), None

    def _emulate(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, select: bool
    ) -> torch.Tensor:
        if select and self.oracle:
            mass = exact_block_mass(q, k, scaling, self.block_size)
            self.sparse.mask = select_by_mass(mass, self.sparse.layout, self.sparse.settings)
        elif select:
            self.sparse.mask = self.sparse.select(q, k, scaling)
        out = block_sparse_attention(q, k, v, scaling, self.sparse.mask, self.block_size)
        return out.to(q.dtype)


def compare_logits(dense: torch.Tensor, sparse: torch.Tensor) -> dict[str, float]:
    agree = dense.argmax(-1) == sparse.argmax(-1)
    # row chunks: at 128K positions one fp32 log-softmax of the logits alone is 24 GiB
    kl = torch.cat([
        F.kl_div(s.float().log_softmax(-1), d.float().log_softmax(-1), log_target=True, reduction="none").sum(-1)
        for d, s in zip(dense.split(8192), sparse.split(8192), strict=True)
    ])  # fmt: skip
    return dict(
        top1=float(agree.float().mean()),
        top1_tail=float(agree[TAIL_FROM:].float().mean()),
        kl=float(kl.mean()),
        kl_tail=float(kl[TAIL_FROM:].mean()),
        kl_max=float(kl.max()),
    )


def density_summary(forwards: list[dict[int, list[float]]]) -> dict[str, object]:
    """Kept causal blocks over causal blocks: per (selecting) layer and KV head, mean over prompts;
    per layer the mean over its heads; overall the mean over layers."""
    per_head = {
        layer: [statistics.mean(f[layer][h] for f in forwards) for h in range(len(heads))]
        for layer, heads in forwards[0].items()
    }
    per_layer = {layer: statistics.mean(heads) for layer, heads in per_head.items()}
    return dict(
        density=statistics.mean(per_layer.values()), density_per_layer=per_layer, density_per_head=per_head
    )


SCORER_VALUES = {
    "sampled": "MASS",
    "pooled": "THRESHOLD",
    "hybrid": "THRESHOLD,MASS",
    "oracle": "MASS",  # --emulate only: the fewest blocks holding MASS of the exact attention (a bound)
}
SINGLE_KNOB = {"sampled": "mass", "pooled": "threshold", "oracle": "mass"}


def parse_config(text: str) -> tuple[str, str]:
    scorer, _, value = text.partition(":")
    if scorer not in SCORER_VALUES or not value:
        expected = ", ".join(f"{sc}:{v}" for sc, v in SCORER_VALUES.items())
        raise argparse.ArgumentTypeError(f"expected one of {expected}, got {text!r}")
    return scorer, value


def knobs(scorer: str, value: str) -> dict[str, float]:
    if scorer == "hybrid":
        threshold, mass = value.split(",")
        return dict(threshold=float(threshold), mass=float(mass))
    return {SINGLE_KNOB[scorer]: float(value)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument(
        "--configs", type=parse_config, nargs="+",
        default=[(SparseSettings.scorer, f"{SparseSettings.threshold},{SparseSettings.mass}")],
        help="scorer:value pairs: " + ", ".join(f"{sc}:{v}" for sc, v in SCORER_VALUES.items()),
    )  # fmt: skip
    parser.add_argument("--samples", type=int, default=SparseSettings.samples)
    parser.add_argument("--local-blocks", type=int, default=SparseSettings.local_blocks)
    parser.add_argument("--dense-layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=SparseSettings.block_size)
    parser.add_argument(
        "--shared", action="store_true", help="select at the first sparse layer only, share it"
    )
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
    a = parser.parse_args()

    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

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
    workspace = None if emulate else torch.empty(128 << 20, dtype=torch.uint8, device=a.device)
    attentions: dict[str, SparseAttention] = {}
    for scorer, value in a.configs:
        if scorer == "oracle" and not emulate:
            parser.error("oracle:MASS needs --emulate (it reads the exact attention)")
        settings = SparseSettings(
            block_size=a.block_size,
            scorer="sampled" if scorer == "oracle" else scorer,
            samples=a.samples,
            local_blocks=a.local_blocks,
            **knobs(scorer, value),
        )
        sparse = SparsePrefill(settings, None if emulate else BlockSparsePrefill(workspace))
        attentions[f"{scorer}:{value}"] = SparseAttention(
            sparse, a.dense_layers, a.block_size, not a.shared, emulate, oracle=scorer == "oracle"
        )
    ids = corpus_ids(tokenizer, a.prompts * a.length)
    per_config: dict[str, list[dict[str, float]]] = {c: [] for c in attentions}
    for i in range(a.prompts):
        tokens = torch.tensor([ids[i * a.length : (i + 1) * a.length]], device=a.device)
        with torch.no_grad():
            model.set_attn_implementation(dense_attention)
            dense = model(tokens).logits[0].float()
            for n, (name, attention) in enumerate(attentions.items()):
                AttentionInterface.register(f"prefill_ext_sparse_{n}", attention)
                model.set_attn_implementation(f"prefill_ext_sparse_{n}")
                per_config[name].append(compare_logits(dense, model(tokens).logits[0].float()))
    summaries = []
    for name, rows in per_config.items():
        summary = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        summary["kl_max"] = max(r["kl_max"] for r in rows)
        summary.update(density_summary(attentions[name].densities))
        summaries.append(dict(config=name, **summary))
        print(
            f"{name}: top-1 agreement {summary['top1']:.4f} (past {TAIL_FROM}: "
            f"{summary['top1_tail']:.4f}), mean KL {summary['kl']:.3g} (past {TAIL_FROM}: "
            f"{summary['kl_tail']:.3g}), max KL {summary['kl_max']:.3g}, density {summary['density']:.3f}",
            flush=True,
        )
    info = dict(
        model=a.model_dir, length=a.length, prompts=a.prompts, dense_layers=a.dense_layers,
        block_size=a.block_size, samples=a.samples, local_blocks=a.local_blocks,
        selection="shared (first sparse layer)" if a.shared else "per layer", configs=summaries,
        device=(torch.cuda.get_device_name() if a.device == "cuda" else "cpu")
        + (" (fp32, emulated: exact chunked attention)" if emulate else " (bf16, FlashInfer block-sparse)"),
        per_prompt=per_config,
    )  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
