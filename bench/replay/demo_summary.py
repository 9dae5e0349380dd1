"""The CPU demo's takeaway: what the extension saved and where it costs, read from the tables that
`bench/replay/schedule_replay.py` and `bench/replay/radix_bench.py` printed (their stdout, saved to files), and
how many third-party warnings the demo held back (`scripts/demo_step.py`'s file).

    python -m bench.replay.demo_summary REPLAY_OUTPUT RADIX_OUTPUT [--held FILE]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table in `text`, as rows keyed by the header's column names."""
    found: list[list[dict[str, str]]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            found.append([])
        elif not set("".join(cells)) <= set("-:"):
            found[-1].append(dict(zip(header, cells, strict=False)))
    return found


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


def replay_lines(text: str) -> list[str]:
    runs = next(t for t in tables(text) if t and "prefill tokens" in t[0])
    by_run = {(row["trace"], row["mode"]): row for row in runs}
    saved, more, ideal, slower, faster = [], [], [], [], 0
    for trace, mode in by_run:
        if not mode.startswith("ext-"):
            continue
        policy = mode.removeprefix("ext-")
        ext, stock = by_run[trace, mode], by_run[trace, f"stock-{policy}"]
        ext_tokens, stock_tokens = number(ext["prefill tokens"]), number(stock["prefill tokens"])
        if ext_tokens < stock_tokens:
            saved.append(
                f"{trace} ({policy}) {ext_tokens:,.0f} vs {stock_tokens:,.0f} ({ext_tokens / stock_tokens - 1:+.0%})"
            )
        elif ext_tokens > stock_tokens:
            more.append(f"{trace} ({policy})")
        elif stock_tokens == number(stock["ideal"]):
            ideal.append(trace)
        ext_ms, stock_ms = number(ext["CPU ms / step"]), number(stock["CPU ms / step"])
        if ext_ms > stock_ms:
            slower.append(f"{trace} ({policy}) {ext_ms:.2f} vs {stock_ms:.2f}")
        else:
            faster += 1
    lines = [
        "Prefill tokens computed (the GPU work the prompts cost): ext saved on "
        + ("; ".join(saved) if saved else "no trace")
        + (f"; computed more on {', '.join(more)}" if more else "; never more than stock")
        + (f"; stock already computes the ideal on {', '.join(sorted(set(ideal)))}" if ideal else "")
        + ".",
        f"Scheduling CPU per pass: ext slower on {len(slower)} of {len(slower) + faster} runs"
        + (f" ({'; '.join(slower)} ms)" if slower else "")
        + ". Each trace runs only a few passes (the passes column), so this column swings from run "
        "to run on a shared box; the LPM line times one long queue.",
    ]
    passes = [t for t in tables(text) if t and "next pass ms" in t[0]]
    rows = {row["mode"]: row for row in (passes[0] if passes else [])}
    if "stock-lpm" in rows and "ext-lpm" in rows:
        stock, ext = rows["stock-lpm"], rows["ext-lpm"]
        lines.append(
            f"LPM ordering of {ext['N waiting']} waiting long prompts, the pass after the first: ext "
            f"{ext['next pass ms']} ms vs stock {stock['next pass ms']} ms (ext re-matches a request "
            "only when its match could have grown)."
        )
    return lines


def radix_lines(text: str) -> list[str]:
    ratios: dict[str, list[float]] = defaultdict(list)
    for row in next(t for t in tables(text) if t and "operation" in t[0]):
        ratios[row["operation"]].append(number(row["speed-up"]))
    lines = [
        "Prefix tree vs stock RadixCache: "
        + "; ".join(f"{op} {min(r):.1f}-{max(r):.1f}x" for op, r in ratios.items())
        + " (faster above 1x)."
    ]
    if min(ratios.get("evict", [1.0])) < 1.0:
        lines.append(
            "evict below 1x: both caches free the evicted slots through SGLang's own KV allocator, "
            "which takes most of the time on both sides (bench/results/radix-cpu.md), so its ratio "
            "is the noise of that shared part, not a cost of the tree."
        )
    return lines


def held_line(held: list[str]) -> str | None:
    """One line counting the held warnings (one per line of `held`), or None when there were none."""
    if not held:
        return None
    return f"{len(held)} third-party warnings ({len(set(held))} distinct) hidden; DEMO_VERBOSE=1 shows them."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("replay", type=Path)
    parser.add_argument("radix", type=Path)
    parser.add_argument("--held", type=Path, default=None, help="scripts/demo_step.py's held warnings")
    args = parser.parse_args()
    print("== Summary")
    for line in replay_lines(args.replay.read_text()) + radix_lines(args.radix.read_text()):
        print(f"- {line}")
    held = held_line(args.held.read_text().splitlines() if args.held else [])
    if held:
        print(held)


if __name__ == "__main__":
    main()
