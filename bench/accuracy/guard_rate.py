"""The guard's decline rate at any bound, from a sparse server's log (`--prefill-ext-sparse-guard`).

    python -m bench.accuracy.guard_rate SERVER_LOG [--bounds 0.3 0.5 0.7 0.8] [--json PATH]

With the guard on, the sparse path logs every checked layer's statistic (ops/guard.py: the low quantile of
the sampled rows' exact attention found in the kept blocks): the forward's first line at sparse layer 0
(`... density D, guard G`), then `sparse layer L, guard G` per later checked layer. A server run with a bound
that never declines (e.g. 0.0001) therefore logs each forward's statistics whole, and the rate at any bound
follows: a forward declines at the first checked layer whose statistic is under the bound, so it declines
when its lowest statistic is. Prints, per bound, the forwards declined and the sparse layer they would decline
at, and the statistic's quantiles per checked layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from bench.lib.stats import percentile

FIRST = re.compile(
    r"prefill-ext sparse: \d+ requests, (\d+) new tokens, \d+ key blocks, density ([\d.]+), guard ([\d.]+)"
)
LATER = re.compile(r"prefill-ext sparse: sparse layer (\d+), guard ([\d.]+)")


@dataclasses.dataclass
class Forward:
    """One sparse forward: its new tokens, kept-block density and guard statistic per checked sparse layer."""

    tokens: int
    density: float
    guard: dict[int, float]


def forwards(lines: list[str]) -> list[Forward]:
    """The sparse forwards a log's lines show, with the guard on."""
    out: list[Forward] = []
    for line in lines:
        if first := FIRST.search(line):
            tokens, density, guard = first.groups()
            out.append(Forward(int(tokens), float(density), {0: float(guard)}))
        elif (later := LATER.search(line)) and out:
            layer, guard = later.groups()
            out[-1].guard[int(layer)] = float(guard)
    return out


def declines_at(stats: dict[int, float], bound: float) -> int | None:
    """The first checked sparse layer whose statistic is under `bound` (None: the forward stays sparse)."""
    return next((layer for layer, g in sorted(stats.items()) if g < bound), None)


def rates(found: list[Forward], bounds: list[float]) -> dict[str, Any]:
    """Per bound, the forwards declined, their share and the sparse layers they decline at; per checked layer,
    the statistic's quantiles over the forwards."""
    per_bound = {}
    for bound in bounds:
        declined = [layer for f in found if (layer := declines_at(f.guard, bound)) is not None]
        per_bound[f"{bound:g}"] = dict(
            declined=len(declined), rate=len(declined) / len(found), layers=sorted(set(declined))
        )
    layers = sorted({layer for f in found for layer in f.guard})
    quantiles = {
        str(layer): {
            f"p{q}": percentile([f.guard[layer] for f in found if layer in f.guard], q)
            for q in (0, 10, 50, 90)
        }
        for layer in layers
    }
    return dict(forwards=len(found), bounds=per_bound, quantiles=quantiles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--bounds", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.8])
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    found = forwards(a.log.read_text(errors="replace").splitlines())
    if not found:
        parser.error(
            f"{a.log}: no sparse forward with a guard statistic (was --prefill-ext-sparse-guard on?)"
        )
    result = rates(found, a.bounds)
    for bound, r in result["bounds"].items():
        print(f"bound {bound}: {r['declined']} of {result['forwards']} forwards declined ({r['rate']:.1%}), "
              f"at sparse layers {r['layers']}")  # fmt: skip
    for layer, q in result["quantiles"].items():
        print(f"sparse layer {layer}: statistic " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
