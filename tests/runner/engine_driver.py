"""Real SGLang on the CPU: `sglang.Engine` serving a tiny random Llama (its tokenizer
manager, its scheduler's normal event loop, torch_native attention, float32), for the tests that need a
model forward (tests/runner/test_yield_layers.py, tests/blend/test_blend_serving.py). It runs in a
subprocess of its own, with `engine_stubs/` on its path (SGLang off CUDA imports vLLM's rotary kernel,
which it never calls there):

    python -m tests.runner.engine_driver RUN.json

RUN.json: {"model": folder, "server": Engine keywords, "rounds": [[[token ids], ...], ...],
"max_new_tokens": N}, and optionally "spans": per round, each prompt's `chunk_spans` (or null), and
"abort": {"round": R, "after_passes": P}: round R's one prompt is aborted once the extension's pass log
(`--prefill-ext-pass-log`) has P more lines, "stagger": {"round": R, "after_passes": P}: round R's
later prompts are sent once its first one's pass log has P more lines (at once on stock, which keeps
none), "hold_slice": a request id, whose first slice of a later chunk waits until a request arrives
(engine_stubs/sitecustomize.py), and "flush_rounds": [R, ...]: while such a round's call runs, the cache is flushed over and over
(`/flush_cache`, which SGLang grants only while idle). Each round's prompts go in one `generate` call
(in order: the first is admitted first), one round after the other. It prints one JSON line: per round, each
prompt's greedy output ids, their logprobs and its finish reason, or the round's error (a
`ValueError`: the HTTP server's 400); then, after the scheduler had time to run its idle check (strict:
a leak raises there, SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE), one more request's output: `alive`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Tiny, so that a chunk of a few hundred tokens runs fast on two cores; weights far from uniform (the
# random model of tests/tiny_models.py), so that logprobs tell forwards apart.
LAYERS = 8
VOCAB = 512
STUBS = Path(__file__).resolve().parent / "engine_stubs"
ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
}
IDLE_CHECK_S = 2.0
_PORTS_LOCK = threading.Lock()
_PORTS_GIVEN: set[int] = set()


def distinct_port() -> int:
    """A free port no other engine of this test process was given. Engines started side by side
    otherwise each take SGLang's `get_free_port` (bind 0, close) for their rendezvous, and two can be
    handed the same one (EADDRINUSE, seen in CI)."""
    with _PORTS_LOCK:
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in _PORTS_GIVEN:
                _PORTS_GIVEN.add(port)
                return port


def write_model(folder: Path) -> Path:
    """A random Llama of LAYERS layers (float32, safetensors) in `folder`."""
    from tests.tiny_models import tiny

    model = tiny("llama", num_hidden_layers=LAYERS, vocab_size=VOCAB, max_position_embeddings=4096)
    model.config.torch_dtype = "float32"
    model.save_pretrained(folder)
    return folder


def serve(tmp: Path, name: str, run: dict[str, Any], options: dict[str, Any] | None) -> dict[str, Any]:
    """From a test: the driver's result for `run` (RUN.json's keys but "model", the one `write_model`
    wrote in `tmp`) on an engine with the extension's `options` (None: stock), its `--prefill-ext-log`
    and `--prefill-ext-pass-log` read back ("log", "pass_log": one dict a line)."""
    import subprocess

    logs = {"pass_log": str(tmp / f"{name}.passes.jsonl"), "log": str(tmp / f"{name}.requests.jsonl")}
    server = {"nccl_port": distinct_port(), **run["server"]}
    if options is not None:
        server |= {"enable_prefill_ext": True, "prefill_ext_options": {**options, **logs}}
    run_file = tmp / f"{name}.json"
    run_file.write_text(json.dumps({**run, "model": str(tmp / "model"), "server": server}))
    env = {**os.environ, **ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STUBS), env.get("PYTHONPATH")]))
    if "hold_slice" in run:
        env["PREFILL_EXT_TEST_HOLD_SLICE"] = run["hold_slice"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.runner.engine_driver", str(run_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key, path in logs.items():
        lines = Path(path).read_text().splitlines() if Path(path).exists() else []
        result[key] = [json.loads(line) for line in lines]
    return result


def engine_kwargs(model: str, server: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_path": model,
        "device": "cpu",
        "attention_backend": "torch_native",
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "disable_cuda_graph": True,
        "disable_overlap_schedule": True,
        "max_total_tokens": 20000,
        "mem_fraction_static": 0.05,
        "random_seed": 0,
        "log_level": "error",
        **server,
    }


def pass_log(run: dict[str, Any]) -> Path | None:
    """The extension's pass log (None: stock, or no log asked for)."""
    path = run["server"].get("prefill_ext_options", {}).get("pass_log")
    return None if path is None else Path(path)


def passes(run: dict[str, Any]) -> int:
    """Lines in the extension's pass log so far (0 when it has none yet)."""
    path = pass_log(run)
    return len(path.read_text().splitlines()) if path is not None and path.is_file() else 0


def generate(engine: Any, run: dict[str, Any], index: int) -> list[dict[str, Any]] | str:
    """Round `index` as one batch (a staggered round: its first prompt, then the rest), through the
    tokenizer manager as `Engine.generate` sends it (with its `chunk_spans`); the `ValueError` it raises
    as text."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    prompts = run["rounds"][index]
    spans = run.get("spans", [None] * len(run["rounds"]))[index]
    abort, stagger = run.get("abort", {}), run.get("stagger", {})
    cut = 1 if stagger.get("round") == index else len(prompts)

    async def send(lo: int, hi: int) -> list[dict[str, Any]]:
        obj = GenerateReqInput(
            input_ids=prompts[lo:hi],
            sampling_params={"max_new_tokens": run["max_new_tokens"], "temperature": 0.0},
            return_logprob=True,
            rid=[f"round{index}-{i}" for i in range(lo, hi)],
            chunk_spans=None if spans is None else spans[lo:hi],
        )
        return await engine.tokenizer_manager.generate_request(obj, None).__anext__()

    async def outputs() -> list[dict[str, Any]]:
        start = passes(run)
        first = asyncio.ensure_future(send(0, cut))
        tasks = [first]
        if cut < len(prompts):  # stock keeps no pass log: the rest at once
            while pass_log(run) and passes(run) - start < stagger["after_passes"] and not first.done():
                await asyncio.sleep(0.001)
            tasks.append(asyncio.ensure_future(send(cut, len(prompts))))
        while abort.get("round") == index and not first.done():
            if passes(run) - start >= abort["after_passes"]:
                engine.tokenizer_manager.abort_request(f"round{index}-0")
                break
            await asyncio.sleep(0.001)
        while index in run.get("flush_rounds", ()) and not all(t.done() for t in tasks):
            await engine.tokenizer_manager.flush_cache()
        return [out for task in tasks for out in await task]

    try:
        return engine.loop.run_until_complete(outputs())
    except ValueError as error:
        return str(error)


def _each(outs: list[dict[str, Any]] | str, field: Callable[[dict[str, Any]], Any]) -> list[Any] | None:
    """`field` of each prompt's output in a round; None for a round that raised."""
    return None if isinstance(outs, str) else [field(out) for out in outs]


def main(run_file: str) -> int:
    import sglang

    run = json.loads(Path(run_file).read_text())
    engine = sglang.Engine(**engine_kwargs(run["model"], run["server"]))
    try:
        rounds = [generate(engine, run, i) for i in range(len(run["rounds"]))]
        time.sleep(IDLE_CHECK_S)
        alive = engine.generate(
            input_ids=[3, 4, 5], sampling_params={"max_new_tokens": 2, "temperature": 0.0}
        )
    finally:
        engine.shutdown()
    result = {
        "outputs": [_each(outs, lambda out: out["output_ids"]) for outs in rounds],
        "logprobs": [
            _each(outs, lambda out: [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
            for outs in rounds
        ],
        "finish": [_each(outs, lambda out: out["meta_info"]["finish_reason"]["type"]) for outs in rounds],
        "errors": [outs if isinstance(outs, str) else None for outs in rounds],
        "alive": alive["output_ids"],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
