"""The forward-time model of a prefill pass, the one the pass budgets plan with (short first and
goodput scheduling), the doctor prices its findings with and the benches predict with."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class PassCost:
    """Predicted forward time of one prefill pass: a fixed cost, a cost per new token, and a cost
    per (new token, context token) pair of causal attention.

    Defaults fitted to stock SGLang 0.5.17 TTFTs on the H200 (8B-shaped model, fa3, chunks of 8192):
    1K 0.030 s, 8K 0.213 s, 32K 1.220 s, 100K 6.720 s (bench/results/2026-12-01-h200-short-first.md
    compares them with the per-pass trace)."""

    fixed_ms: float = 5.0
    token_us: float = 22.0
    pair_ps: float = 890.0

    @classmethod
    def parse(cls, text: str) -> PassCost:
        """`FIXED_MS,TOKEN_US,PAIR_PS`, e.g. `5,22,890`."""
        parts = text.split(",")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 3 or min(values) < 0:
            raise ValueError("expected FIXED_MS,TOKEN_US,PAIR_PS (three numbers >= 0)")
        return cls(*values)

    def __str__(self) -> str:
        """The `FIXED_MS,TOKEN_US,PAIR_PS` text `parse` reads (six significant digits each)."""
        return f"{self.fixed_ms:g},{self.token_us:g},{self.pair_ps:g}"

    def variable_ms(self, tokens: int, context: int) -> float:
        """Time `tokens` new tokens after `context` cached ones add to a pass (the fixed cost aside)."""
        pairs = tokens * context + tokens * tokens / 2
        return tokens * self.token_us * 1e-3 + pairs * self.pair_ps * 1e-9

    def tokens_within(self, ms: float, context: int) -> int:
        """The most new tokens after `context` cached ones whose variable time fits in `ms`."""
        if ms <= 0:
            return 0
        a = self.pair_ps * 1e-9 / 2
        b = self.token_us * 1e-3 + self.pair_ps * 1e-9 * context
        if a == 0:
            return int(ms / b) if b > 0 else 1 << 40
        return int((-b + math.sqrt(b * b + 4 * a * ms)) / (2 * a))
