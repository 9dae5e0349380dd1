"""bench/gpu/run_sparse_study.sh's server steps on the CPU, with the stand-in `sglang.launch_server`
(tests/stubs/sglang): one YaRN view's servers get its model and context, a held step on another view is
refused, the next view's servers (with ATTENTION_BACKEND) replace the first's on the same ports, and stop leaves
none."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUBS = Path(__file__).resolve().parent / "stubs"
SCRIPTS = REPO / "bench" / "gpu"


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the two servers' ports)."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port


def argv(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
        return json.load(r)["argv"]


def flag(args: list[str], name: str) -> str:
    """The value of the last `name` given (the one argparse keeps)."""
    return args[max(i for i, a in enumerate(args) if a == name) + 1]


def test_each_view_s_servers_get_its_model_and_context_and_replace_the_last(tmp_path: Path) -> None:
    port = free_port_pair()
    site_ext = tmp_path / "site-ext"
    site_ext.mkdir()
    (site_ext / ".patched").touch()  # the stand-in needs no patching
    models = {}
    for factor in ("2", ""):
        models[factor] = tmp_path / f"qwen-coder-0.5b-hf{factor and '-yarn' + factor}"
        models[factor].mkdir()
        (models[factor] / "config.json").write_text("{}")
    base = {
        **os.environ,
        "PY": sys.executable,
        "PYTHONPATH": f"{STUBS}:{REPO}",
        "INSTALL": "0",
        "REAL_MODEL": "qwen-coder-0.5b",
        "OUT": str(tmp_path / "out"),
        "STATE": str(tmp_path / "state"),
        "STUDY": str(tmp_path / "study"),
        "SITE_EXT": str(site_ext),
        "PORT": str(port),
    }

    def study(step: str, factor: str, **extra: str) -> subprocess.CompletedProcess[str]:
        env = {**base, "STEP": step, "YARN_FACTOR": factor, "MODEL": str(models[factor]), **extra}
        return subprocess.run(
            ["bash", str(SCRIPTS / "run_sparse_study.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )

    try:
        done = study("servers", "2")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        stock, sparse = argv(port), argv(port + 1)
        for args in (stock, sparse):
            assert flag(args, "--model-path") == str(models["2"])
            assert flag(args, "--context-length") == "65536"
        assert "--prefill-ext-sparse" in sparse and "--prefill-ext-sparse" not in stock

        refused = study("held", "")
        assert refused.returncode == 3
        assert f"the servers run {models['2']}, not {models['']}" in refused.stdout

        done = study("servers", "", ATTENTION_BACKEND="flashinfer")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "stopped stock" in done.stdout and "stopped sp0" in done.stdout
        for p in (port, port + 1):
            args = argv(p)
            assert flag(args, "--model-path") == str(models[""])
            assert flag(args, "--context-length") == "32768"
            assert flag(args, "--attention-backend") == "flashinfer"
    finally:
        stop = {**base, "STEP": "stop"}
        subprocess.run(["bash", str(SCRIPTS / "run_ruler.sh")], env=stop, capture_output=True, timeout=100)
    assert not (tmp_path / "state" / "servers").exists()
    for p in (port, port + 1):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p)) != 0  # nothing answers there now


def test_a_view_run_real_does_not_make_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "PY": sys.executable, "INSTALL": "0", "YARN_FACTOR": "3", "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(SCRIPTS / "run_sparse_study.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "YARN_FACTOR=3: 4, 2 or empty" in done.stderr
