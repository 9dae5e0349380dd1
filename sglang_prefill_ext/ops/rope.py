"""Rotary position embeddings of Qwen2/Llama-style models: the inverse frequencies, plain or YaRN.

The same float32 arithmetic as SGLang's `RotaryEmbedding` / `YaRNScalingRotaryEmbedding`
(`_compute_inv_freq`), so angles computed from these are the ones in its cos/sin table. YaRN's
attention factor (mscale: 0.1 ln(factor) + 1, times attn_factor) multiplies that table's cos and
sin, hence every cached key, but is no part of the frequencies: a rotation between two positions
(`ops.rerotate`) leaves it as it was cached.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class Yarn:
    """A config's `rope_scaling` of type yarn (its beta/extrapolation keys at their defaults if unset)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32
    beta_slow: float = 1
    extrapolation_factor: float = 1
    truncate: bool = True


@dataclasses.dataclass(frozen=True)
class Rope:
    """Rotary over the whole head (rotary_dim == head_dim), neox layout (rotate_half)."""

    head_dim: int
    base: float
    yarn: Yarn | None = None

    def __post_init__(self) -> None:
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even number, got {self.head_dim}")

    def inv_freq(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[head_dim / 2] float32: the angle per position of each rotated pair."""
        dim = self.head_dim
        pos_freqs = self.base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
        extrapolation = 1.0 / pos_freqs
        if self.yarn is None:
            return extrapolation.to(device)
        yarn = self.yarn
        interpolation = 1.0 / (yarn.factor * pos_freqs)
        low, high = self._correction_range(yarn)
        mask = (1 - _linear_ramp(low, high, dim // 2)) * yarn.extrapolation_factor
        return (interpolation * (1 - mask) + extrapolation * mask).to(device)

    def _correction_range(self, yarn: Yarn) -> tuple[float, float]:
        """The dims (pairs) between which YaRN ramps from extrapolation to interpolation."""

        def dim_of(rotations: float) -> float:
            turns = yarn.original_max_position_embeddings / (rotations * 2 * math.pi)
            return self.head_dim * math.log(turns) / (2 * math.log(self.base))

        low, high = dim_of(yarn.beta_fast), dim_of(yarn.beta_slow)
        if yarn.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, self.head_dim - 1)


def _linear_ramp(low: float, high: float, size: int) -> torch.Tensor:
    if low == high:
        high += 0.001  # as SGLang: no division by zero
    return torch.clamp((torch.arange(size, dtype=torch.float) - low) / (high - low), 0, 1)
