"""`--png`: the report at a glance (matplotlib, imported only here: `pip install sglang-prefill-ext[plot]`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render(report: dict[str, Any], png: Path) -> None:
    """Hit rate over time, divergence positions and the tokens each fix would recover, in one PNG.
    ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (over_time, divergence, fixes) = plt.subplots(1, 3, figsize=(15, 4.2))
    for log, windows in report["hit_rate_over_time"].items():  # one line per log: each its own cache
        rates = [100 * r if r is not None else float("nan") for r in windows]
        over_time.plot(range(1, len(rates) + 1), rates, marker="o", label=Path(log).name)
    if len(report["hit_rate_over_time"]) > 1:
        over_time.legend(fontsize="small")
    over_time.set(
        title=f"hit rate over time (overall {100 * (report['hit_rate'] or 0):.1f} %)",
        xlabel="window of each log's requests, in start order",
        ylabel="cached / prompt tokens (%)",
        ylim=(-2, 102),
    )
    positions = report["divergence"]["positions"]
    if positions:
        divergence.hist([p / 1024 for p in positions], bins=40)
    divergence.set(
        title="where prompts stop sharing", xlabel="divergence offset (K tokens)", ylabel="requests"
    )
    findings = report["findings"]
    several = len(report["logs"]) > 1
    names = [
        f["pattern"].replace("_", " ") + (f"\n{Path(f['log']).name}" if several else "") for f in findings
    ]
    tokens = [f["tokens"] / 1e3 for f in findings]
    bars = fixes.barh(names or ["no finding"], tokens or [0], color="tab:green")
    for bar, f in zip(bars, findings, strict=False):
        fixes.annotate(
            f" {f['tokens']:,} tok, ~{f['gpu_s']:.1f} GPU s",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            va="center",
        )
    fixes.set(title="prefill tokens each fix would save", xlabel="K tokens")
    fixes.margins(x=0.45)
    fixes.invert_yaxis()
    logs = report["logs"]
    source = Path(logs[0]).name if len(logs) == 1 else f"{len(logs)} logs"  # a title that fits
    fig.suptitle(f"cache doctor: {report['requests']:,} requests from {source}")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
