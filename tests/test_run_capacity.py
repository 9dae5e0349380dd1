"""bench/gpu/run_capacity.sh end to end on the CPU: a stand-in `sglang.launch_server` (tests/stubs/sglang)
per variant, the capacity sweep against each, stock's calibration judging the others, a server that does
not start reported, the compare of them all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUBS = Path(__file__).resolve().parent / "stubs"


def test_run_capacity_sweeps_every_variant_and_reports_the_one_that_did_not_start(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PY": sys.executable,
        "PYTHONPATH": f"{STUBS}:{REPO}",
        "INSTALL": "0",
        "OUT": str(out),
        "SITE_EXT": str(tmp_path / "site-ext"),
        "GPUS": "0",
        "VARIANTS": "stock stock_2048 ext_gp ext_gp_yield ext_broken",
        "FLAGS_ext_broken": "--fail",
        "WORKLOADS": "mixed",
        "SERVER_ARGS": "--load-format dummy",
        "CAPACITY_ARGS": "--factors 1 --seeds 1 --per-point 20 --mixed-short-rate 200 --mixed-long-every-s 0.05 "
        "--mixed-long-tokens 4096 --calibration-lengths 1024,2048,4096 --calibration-reps 1 --max-new-tokens 2",
        "BUDGET_S": "300",
    }
    done = subprocess.run(
        ["bash", str(REPO / "bench/gpu/run_capacity.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    md = (out / "capacity.md").read_text()
    for variant in ("stock", "stock_2048", "ext_gp", "ext_gp_yield"):
        assert f"| {variant} | " in md
    assert "ext_broken: the server did not start (--fail)" in md
    assert "refusing to start" in md  # the end of its log
    assert (out / "capacity.png").stat().st_size > 0
    with tarfile.open(out / "capacity-results.tar.gz") as tar:
        runs = {
            Path(m.name).parent.name: json.load(tar.extractfile(m))
            for m in tar.getmembers()
            if m.name.endswith("capacity.json")
        }
    assert set(runs) == {"stock", "stock_2048", "ext_gp", "ext_gp_yield"}
    assert runs["stock_2048"]["server"]["chunked_prefill_size"] == 2048  # the variant's flags reached it
    env = (out / "env.txt").read_text()
    assert (
        "ext_gp_yield: --enable-prefill-ext --prefill-ext-tbt-target-ms 100 --disable-overlap-schedule "
        in env
    )
    # every variant judged by stock's time alone; each still measured its own
    stock_alone = runs["stock"]["calibration"]["alone_cost"]
    assert all(run["targets"]["alone_cost"] == stock_alone for run in runs.values())
    assert runs["ext_gp"]["alone_from"].endswith("stock/capacity.json")
