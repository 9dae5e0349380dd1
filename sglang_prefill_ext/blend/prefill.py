"""A blended prefill in torch over a Llama / Qwen2-style decoder: the reference the serving path must match.

The model is a transformers `*ForCausalLM` (duck-typed: embed_tokens, layers with q/k/v/o projections,
norms and MLP, final norm, lm_head), run layer by layer here rather than through its own forward, so
the rows that pass through a layer can be any subset of the prompt's positions. RoPE is applied in
float32 from `ops.rope` (SGLang's table) and cast to the model's dtype, as SGLang caches keys.

- `full_prefill`: every position through every layer, the KV and the final hidden states.
- `cached_chunk`: a chunk's KV as the store would hold it, from a prefill of `context` (what precedes
  the chunk when it was cached, e.g. the system prompt alone) with the chunk at its end.
- `reused_kv`: a prompt's blended KV before recompute: each chunk's cached K moved to the chunk's
  span (`ops.rerotate`), its V copied, zeros elsewhere (every other position is computed).
- `blended_prefill`: the computed rows (`blend.select`) through the layers, each layer's fresh K and
  V overwriting the reused ones at those rows before the rows attend causally over the blended KV.
  `Rule.FIXED` computes its rows from the first layer; `Rule.DEVIATION` computes every row up to
  `check_layer` and keeps, from there on, the rows `largest_deviation` picks at that layer.

At ratio 1.0 both rules compute every row at every layer, so the result is `full_prefill`'s.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import torch

from sglang_prefill_ext.blend.select import fixed_ratio, kv_deviation, largest_deviation
from sglang_prefill_ext.blend.spans import Span
from sglang_prefill_ext.ops.blend_attention import blend_attention
from sglang_prefill_ext.ops.rerotate import rerotate
from sglang_prefill_ext.ops.rope import Rope

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
MODEL_TYPES = ("llama", "qwen2")


class Rule(enum.Enum):
    FIXED = "fixed"
    DEVIATION = "deviation"


@dataclasses.dataclass
class KV:
    """Every layer's K and V of a prompt: [layers, tokens, kv_heads, head_dim] each."""

    k: torch.Tensor
    v: torch.Tensor

    def slice(self, start: int, end: int) -> KV:
        return KV(self.k[:, start:end].clone(), self.v[:, start:end].clone())


@dataclasses.dataclass
class CachedChunk:
    """A chunk's KV as cached: its first token at `position`."""

    kv: KV
    position: int


@dataclasses.dataclass
class Prefill:
    kv: KV
    hidden: torch.Tensor  # [rows, hidden]: the final (normed) hidden states of the computed rows
    rows: torch.Tensor  # [rows] int64: their positions, ascending (after the last layer)
    computed: torch.Tensor  # [tokens] bool: the rows computed through the last layer


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A transformers Llama / Qwen2 causal LM and its RoPE, checked to be what this forward computes."""

    model: Any
    rope: Rope
    kv_heads: int
    heads: int

    @classmethod
    def of(cls, model: Any) -> Decoder:
        config = model.config
        if config.model_type not in MODEL_TYPES:
            raise ValueError(f"blend.prefill runs {MODEL_TYPES} models, not {config.model_type!r}")
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"blend.prefill runs plain RoPE, not {rope.get('rope_type')!r}")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("blend.prefill runs full attention; this model uses a sliding window")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(model, Rope(head_dim, rope["rope_theta"]), config.num_key_value_heads, heads)

    @property
    def layers(self) -> Any:
        return self.model.model.layers

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    def empty_kv(self, tokens: int) -> KV:
        shape = (len(self.layers), tokens, self.kv_heads, self.rope.head_dim)
        return KV(
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            torch.zeros(shape, dtype=self.dtype, device=self.device),
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.rope.inv_freq(x.device)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def forward(
        self,
        ids: torch.Tensor,
        kv: KV,
        computed: torch.Tensor,
        narrow: tuple[int, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] | None,
        attention: Attention,
    ) -> Prefill:
        """The `computed` rows of `ids` through every layer over `kv`, which they update in place. With
        `narrow` = (layer, choose), at that layer `choose(rows, fresh_k, fresh_v)` (before the rows' KV
        is written) gives the new `computed` mask, and only its rows go on to attention and beyond."""
        rows = computed.nonzero()[:, 0]
        hidden = self.model.model.embed_tokens(ids[rows])
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = self._rotate(attn.q_proj(x).view(len(rows), self.heads, -1), rows)
            k = self._rotate(attn.k_proj(x).view(len(rows), self.kv_heads, -1), rows)
            v = attn.v_proj(x).view(len(rows), self.kv_heads, -1)
            keep = None
            if narrow is not None and narrow[0] == index:
                computed = narrow[1](rows, k, v)
                keep = computed[rows]
            kv.k[index, rows] = k
            kv.v[index, rows] = v
            if keep is not None:
                q, hidden, rows = q[keep], hidden[keep], rows[keep]
            out = attention(q, kv.k[index], kv.v[index], rows, attn.scaling)
            hidden = hidden + attn.o_proj(out.reshape(len(rows), -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return Prefill(kv, self.model.model.norm(hidden), rows, computed)


def _as_ids(ids: torch.Tensor | list[int], decoder: Decoder) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long, device=decoder.device)


def full_prefill(
    decoder: Decoder, ids: torch.Tensor | list[int], attention: Attention = blend_attention
) -> Prefill:
    ids = _as_ids(ids, decoder)
    every = torch.ones(len(ids), dtype=torch.bool, device=decoder.device)
    return decoder.forward(ids, decoder.empty_kv(len(ids)), every, None, attention)


def cached_chunk(
    decoder: Decoder,
    context: list[int],
    chunk: list[int],
    attention: Attention = blend_attention,
) -> CachedChunk:
    """`chunk`'s KV from a prefill of `context + chunk`, its first token at position len(context)."""
    kv = full_prefill(decoder, context + chunk, attention).kv
    return CachedChunk(kv.slice(len(context), len(context) + len(chunk)), len(context))


def reused_kv(decoder: Decoder, prompt_len: int, spans: tuple[Span, ...], chunks: list[CachedChunk]) -> KV:
    """The blended KV before recompute: chunk i's cached KV at spans[i] (K re-rotated), zeros elsewhere."""
    if len(chunks) != len(spans):
        raise ValueError(f"{len(spans)} spans but {len(chunks)} cached chunks")
    kv = decoder.empty_kv(prompt_len)
    for (start, end), chunk in zip(spans, chunks, strict=True):
        if chunk.kv.k.shape[1] != end - start:
            raise ValueError(
                f"span [{start}, {end}) holds {end - start} tokens, its chunk {chunk.kv.k.shape[1]}"
            )
        to_pos = torch.arange(start, end, device=decoder.device)
        from_pos = to_pos - start + chunk.position
        layers, tokens, heads, dim = chunk.kv.k.shape
        keys = chunk.kv.k.transpose(0, 1).reshape(tokens, layers * heads, dim)  # one rotation for all layers
        moved = rerotate(keys, from_pos, to_pos, decoder.rope)
        kv.k[:, start:end] = moved.view(tokens, layers, heads, dim).transpose(0, 1)
        kv.v[:, start:end] = chunk.kv.v
    return kv


def blended_prefill(
    decoder: Decoder,
    ids: torch.Tensor | list[int],
    spans: tuple[Span, ...],
    reused: KV,
    ratio: float,
    rule: Rule,
    check_layer: int = 1,
    attention: Attention = blend_attention,
) -> Prefill:
    """A prefill of `ids` over `reused` (from `reused_kv`; updated in place), recomputing `ratio` of the
    chunk tokens chosen by `rule` (`Rule.DEVIATION` at `check_layer`)."""
    ids = _as_ids(ids, decoder)
    if rule is Rule.FIXED:
        return decoder.forward(
            ids, reused, fixed_ratio(spans, len(ids), ratio, decoder.device), None, attention
        )
    if not 0 <= check_layer < len(decoder.layers):
        raise ValueError(
            f"check_layer must be a layer of the model's {len(decoder.layers)}, got {check_layer}"
        )

    def choose(rows: torch.Tensor, fresh_k: torch.Tensor, fresh_v: torch.Tensor) -> torch.Tensor:
        # every row is computed up to check_layer, so `rows` is every position here
        deviation = kv_deviation(fresh_k, fresh_v, reused.k[check_layer, rows], reused.v[check_layer, rows])
        return largest_deviation(spans, deviation, ratio)

    every = torch.ones(len(ids), dtype=torch.bool, device=decoder.device)
    return decoder.forward(ids, reused, every, (check_layer, choose), attention)
