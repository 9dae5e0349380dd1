"""Accuracy of block-sparse prefill on real weights: next-token predictions, sparse vs dense (issue 6).

    python bench/sparse_accuracy.py --model-dir DIR [--prompts 8] [--length 8192] [--json PATH]
        [--configs sampled:0.95 pooled:0.05 ...] [--samples 2] [--local-blocks 4] [--dense-layers 2]
        [--block-size 128] [--shared] [--device cuda|cpu] [--emulate]

Loads an HF checkpoint (SmolLM2-135M-Instruct, converted by scripts/models/convert_smollm2.py) with
transformers on the GPU and runs each prompt of `--length` tokens of real text (`real_text.py`) twice:
dense (torch SDPA, causal) and with every layer from `--dense-layers` on attending through this
package's `SparsePrefill` exactly as the serving backend runs a fresh prompt (one KV pool slot per
position, selection and plan in every sparse layer, or with --shared once at the first). With
--emulate (always on the CPU) the model runs in fp32 and the kept blocks through exact masked SDPA,
so only the selection differs from dense. Reports, over
every position and over the positions past the first 1,024: top-1 agreement of the next-token
argmax, mean KL(dense || sparse) of the next-token distributions, and the kept-block density (mean
over the selecting layers), for every scorer:value setting given.
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

TAIL_FROM = 1024


class SparseAttention:
    """A transformers attention function: SDPA for the first layers, `SparsePrefill` for the rest."""

    def __init__(
        self, sparse: SparsePrefill, dense_layers: int, block_size: int, per_layer: bool, emulate: bool
    ):
        self.sparse = sparse
        self.dense_layers = dense_layers
        self.block_size = block_size
        self.per_layer = per_layer
        self.emulate = emulate
        self.densities: list[float] = []

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if module.layer_idx < self.dense_layers:
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout, scaling, **kwargs
            )
        assert query.shape[0] == 1, "one prompt per forward"
        length = query.shape[2]
        q = query[0].transpose(0, 1).contiguous()  # [L, Hq, D]
        k, v = key[0].transpose(0, 1).contiguous(), value[0].transpose(0, 1).contiguous()
        first = module.layer_idx == self.dense_layers
        if first:
            layout = BlockLayout.build([0], [length], self.block_size, q.device)
            self.sparse.begin(layout, torch.arange(length, device=q.device))
            self._layer_densities: list[float] = []
        select = first or self.per_layer
        if self.emulate:
            out = self._emulate(q, k, v, scaling, select)
        else:
            out = self.sparse.forward(q, k, v, scaling, replan=self.per_layer)
        if select:
            self._layer_densities.append(self.sparse.density())
        if module.layer_idx == module.config.num_hidden_layers - 1:
            self.densities.append(statistics.mean(self._layer_densities))
        return out.unsqueeze(0), None

    def _emulate(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, select: bool
    ) -> torch.Tensor:
        """The same block selection, then exact attention restricted to the kept blocks (masked SDPA in
        the model's dtype, fp32 here), so only the selection differs from dense."""
        group = q.shape[1] // k.shape[1]
        if select:
            self.sparse.mask = self.sparse.select(q, k, scaling)
            blocks = torch.arange(q.shape[0], device=q.device) // self.block_size
            keep = (
                self.sparse.mask[:, blocks][:, :, blocks]
                & torch.ones(q.shape[0], q.shape[0], dtype=torch.bool, device=q.device).tril()
            )
            self._keep = keep.repeat_interleave(group, 0)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1), v.repeat_interleave(group, 1).transpose(0, 1),
            attn_mask=self._keep, scale=scaling,
        )  # fmt: skip
        return out.transpose(0, 1)


def compare_logits(dense: torch.Tensor, sparse: torch.Tensor, density: float) -> dict[str, float]:
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
        density=density,
    )


def parse_config(text: str) -> tuple[str, str]:
    scorer, _, value = text.partition(":")
    if scorer not in ("sampled", "pooled", "hybrid") or not value:
        raise argparse.ArgumentTypeError(
            f"expected sampled:MASS, pooled:THRESHOLD or hybrid:THRESHOLD,MASS, got {text!r}"
        )
    return scorer, value


def knobs(scorer: str, value: str) -> dict[str, float]:
    if scorer == "hybrid":
        threshold, mass = value.split(",")
        return dict(threshold=float(threshold), mass=float(mass))
    return {"mass" if scorer == "sampled" else "threshold": float(value)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument(
        "--configs", type=parse_config, nargs="+",
        default=[(SparseSettings.scorer, f"{SparseSettings.threshold},{SparseSettings.mass}")],
        help="scorer:value pairs: sampled:MASS (coverage), pooled:THRESHOLD or hybrid:THRESHOLD,MASS",
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
        "--emulate", action="store_true", help="on cuda too: fp32 model, exact masked attention"
    )
    a = parser.parse_args()

    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)
    emulate = a.emulate or a.device == "cpu"
    model = AutoModelForCausalLM.from_pretrained(
        a.model_dir, dtype=torch.float32 if emulate else torch.bfloat16, attn_implementation="sdpa"
    )
    model = model.to(a.device).eval()
    workspace = None if emulate else torch.empty(128 << 20, dtype=torch.uint8, device=a.device)
    attentions = {}
    for scorer, value in a.configs:
        settings = SparseSettings(
            block_size=a.block_size,
            scorer=scorer,
            samples=a.samples,
            local_blocks=a.local_blocks,
            **knobs(scorer, value),
        )
        sparse = SparsePrefill(settings, None if emulate else BlockSparsePrefill(workspace))
        attentions[scorer, value] = SparseAttention(
            sparse, a.dense_layers, a.block_size, not a.shared, emulate
        )
    ids = corpus_ids(tokenizer, a.prompts * a.length)
    per_config: dict[tuple[str, str], list[dict[str, float]]] = {c: [] for c in attentions}
    for i in range(a.prompts):
        tokens = torch.tensor([ids[i * a.length : (i + 1) * a.length]], device=a.device)
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            dense = model(tokens).logits[0].float()
            for n, (config, attention) in enumerate(attentions.items()):
                AttentionInterface.register(f"prefill_ext_sparse_{n}", attention)
                model.set_attn_implementation(f"prefill_ext_sparse_{n}")
                sparse_logits = model(tokens).logits[0].float()
                per_config[config].append(compare_logits(dense, sparse_logits, attention.densities[-1]))
    summaries = []
    for (scorer, value), rows in per_config.items():
        summary = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        summary["kl_max"] = max(r["kl_max"] for r in rows)
        summaries.append(dict(scorer=scorer, value=value, **summary))
        print(
            f"{scorer} {value}: top-1 agreement {summary['top1']:.4f} (past {TAIL_FROM}: "
            f"{summary['top1_tail']:.4f}), mean KL {summary['kl']:.3g} (past {TAIL_FROM}: "
            f"{summary['kl_tail']:.3g}), max KL {summary['kl_max']:.3g}, density {summary['density']:.3f}",
            flush=True,
        )
    info = dict(
        model=a.model_dir, length=a.length, prompts=a.prompts, dense_layers=a.dense_layers,
        block_size=a.block_size, samples=a.samples, local_blocks=a.local_blocks,
        selection="shared (first sparse layer)" if a.shared else "per layer", configs=summaries,
        device=(torch.cuda.get_device_name() if a.device == "cuda" else "cpu")
        + (" (fp32, emulated sparse attention)" if emulate else " (bf16, FlashInfer block-sparse)"),
        per_prompt={f"{sc}:{v}": rows for (sc, v), rows in per_config.items()},
    )  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
