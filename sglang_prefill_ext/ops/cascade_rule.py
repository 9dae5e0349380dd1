"""When an extend batch over a shared cached prefix should run cascade attention instead of stock's.

Both paths do the same arithmetic; they differ in how it is laid out:

- stock (SGLang 0.5.17's FlashInfer backend): per layer, a ragged causal pass of each request's new
  tokens over themselves, a paged pass of each request's new tokens over its whole cached prefix
  (the shared part is read once per request), and one merge;
- cascade (`ops.cascade.CascadePrefill`): one pass of all new tokens stacked over the shared prefix
  (paged, or ragged when its KV slots are one contiguous run), one paged causal pass of each
  request's new tokens over its own cached remainder and itself, and one merge; plus, once per
  forward, finding the shared prefix and planning (host work, amortised over the layers).

Each pass is modelled as a fixed cost plus FLOPs over a throughput, with the constants in
`CascadeCosts`. The rule picks cascade when at least two requests share at least `min_shared`
tokens and the modelled speed-up reaches `min_speedup`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class CascadeCosts:
    """Per-pass throughputs (TFLOP/s) and fixed costs of both paths on one GPU.

    Where the defaults come from (`DEFAULT_COSTS`): fitted by `bench/cascade_bench.py` on the H200
    on 2026-11-29 (bench/results/2026-11-29-h200-cascade.md: 16x512 over 32K, 32x256 over 64K,
    8x1K over 16K; bf16, 32/8 heads, head_dim 128, page 1). With them the rule expects ~1.0x for
    scattered shared slots and ~1.2x when the shared slots are one contiguous run.
    """

    stock_prefix_tflops: float = 518.3  # stock paged pass, new tokens over their cached prefix
    stock_new_tflops: float = 207.2  # stock ragged causal pass, new tokens over themselves
    shared_paged_tflops: float = 532.5  # cascade: all new tokens over the shared prefix, paged
    shared_contiguous_tflops: float = 651.6  # the same over contiguous KV slots, ragged kernel
    own_tflops: float = 151.1  # cascade: paged causal pass over own remainder + new tokens
    pass_us: float = 67.5  # fixed cost of one attention pass or merge, per layer
    plan_ms: float = 1.8  # per forward: shared-prefix search, indices, FlashInfer plans


DEFAULT_COSTS = CascadeCosts()


@dataclasses.dataclass(frozen=True)
class CascadeShape:
    """One extend batch: the tokens all its requests share, and each request's cached and new tokens."""

    shared_len: int
    prefix_lens: Sequence[int]
    extend_lens: Sequence[int]
    shared_contiguous: bool
    num_qo_heads: int
    head_dim: int
    num_layers: int


@dataclasses.dataclass(frozen=True)
class CascadeDecision:
    use_cascade: bool
    stock_ms: float  # modelled attention time per forward (all layers)
    cascade_ms: float

    @property
    def speedup(self) -> float:
        return self.stock_ms / self.cascade_ms


def pair_flops(q_len: int, kv_len: int, causal: bool, num_qo_heads: int, head_dim: int) -> float:
    """FLOPs (QK^T and PV) of q_len queries over kv_len keys; causal: the queries are the last keys."""
    pairs = q_len * kv_len - (q_len * (q_len - 1) / 2 if causal else 0)
    return 4.0 * head_dim * num_qo_heads * pairs


def _ms(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e9)


def model_ms(shape: CascadeShape, costs: CascadeCosts) -> tuple[float, float]:
    """(stock, cascade) attention milliseconds per forward, all layers."""
    heads, dim = shape.num_qo_heads, shape.head_dim
    lens = list(zip(shape.prefix_lens, shape.extend_lens, strict=True))
    prefix = sum(pair_flops(n, p, False, heads, dim) for p, n in lens)
    new = sum(pair_flops(n, n, True, heads, dim) for _, n in lens)
    own = sum(pair_flops(n, p - shape.shared_len + n, True, heads, dim) for p, n in lens)
    shared = pair_flops(sum(shape.extend_lens), shape.shared_len, False, heads, dim)
    shared_tflops = costs.shared_contiguous_tflops if shape.shared_contiguous else costs.shared_paged_tflops
    fixed = 3 * costs.pass_us / 1e3  # two attention passes and a merge, on either path
    stock = fixed + _ms(prefix, costs.stock_prefix_tflops) + _ms(new, costs.stock_new_tflops)
    cascade = fixed + _ms(shared, shared_tflops) + _ms(own, costs.own_tflops)
    return stock * shape.num_layers, cascade * shape.num_layers + costs.plan_ms


def choose_cascade(
    shape: CascadeShape, min_shared: int, min_speedup: float, costs: CascadeCosts = DEFAULT_COSTS
) -> CascadeDecision:
    """Cascade for batches of >= 2 requests sharing >= min_shared tokens, if modelled >= min_speedup."""
    if min_shared < 1:
        raise ValueError(f"min_shared must be >= 1, got {min_shared}")
    stock, cascade = model_ms(shape, costs)
    eligible = len(shape.extend_lens) >= 2 and shape.shared_len >= min_shared
    return CascadeDecision(eligible and stock >= min_speedup * cascade, stock, cascade)
