"""The variants a capacity run compares, by name: stock's knob matrix (issue 39: stock's best knob is
chosen among these) and the extension's, as server flags. bench/gpu/run_capacity.sh starts a server
per name (`python -m bench.lib.variants` prints them), bench/replay/capacity_replay.py replays the
same names, so a prediction and a measurement of one variant share its label.

Standard library only.
"""

from __future__ import annotations

import sys

GOODPUT = "--enable-prefill-ext --prefill-ext-tbt-target-ms 100"
VARIANTS: dict[str, str] = {
    "stock": "",
    "stock_mc": "--enable-mixed-chunk",
    "stock_2048": "--chunked-prefill-size 2048",
    "stock_2048mc": "--chunked-prefill-size 2048 --enable-mixed-chunk",
    "stock_4096": "--chunked-prefill-size 4096",
    "stock_4096mc": "--chunked-prefill-size 4096 --enable-mixed-chunk",
    # SGLang 0.5.17 refuses PD-multiplexing with chunked prefill or the overlap scheduler
    "stock_pdmux": "--enable-pdmux --chunked-prefill-size -1 --disable-overlap-schedule",
    "ext_gp": GOODPUT,
    "ext_gp_ahead": f"{GOODPUT} --prefill-ext-lone-chunk-sync false",  # a lone chunk's next formed ahead
    "ext_gp_lone": f"{GOODPUT} --prefill-ext-lone-pass-ms 150",
    # --prefill-ext-yield-layers runs in the normal event loop: ext_gp_normal is the same loop without slices
    "ext_gp_normal": f"{GOODPUT} --disable-overlap-schedule",
    "ext_gp_yield": f"{GOODPUT} --disable-overlap-schedule --prefill-ext-yield-layers 4",
}


def main() -> int:
    for name, flags in VARIANTS.items():
        print(f"{name}\t{flags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
