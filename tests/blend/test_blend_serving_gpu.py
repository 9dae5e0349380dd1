"""(gpu) Chunk blending through a real SGLang 0.5.17 server (docs/BLEND.md), one model: the checkpoint
`$PREFILL_EXT_BLEND_MODEL` names (e.g. the Qwen2.5-Coder-1.5B that `bench/gpu/run_real.sh` converts to
`/tmp/qwen-coder-hf`); skipped without CUDA or without it. One call: bench/gpu/README.md.

- flag off: a request's `chunk_spans` (valid or malformed) changes nothing: the same greedy ids as the
  same request without it, on a server without `--prefill-ext-blend` (its greedy identity with stock
  itself is `run_real.sh`'s);
- under `--prefill-ext-blend`: ratio 1 gives the full prefill's greedy ids; a reordered chunk set runs
  as the ratio's heads and the question in one forward pass on the server's fa3 backend (its
  `--prefill-ext-log` line: `chunks`, and `blend`, the tokens reused and recomputed); with a chunk
  budget below the prompt it runs one pass per computed run instead, to the same greedy ids;
  malformed spans get a 400 with `parse_chunk_spans`'s message, on `/generate` and on
  `/v1/completions`. The same on the CPU, on a tiny model: tests/blend/test_blend_serving.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.lib.client import http_json, wait_healthy

pytestmark = pytest.mark.gpu

MODEL = os.environ.get("PREFILL_EXT_BLEND_MODEL", "")
NEW_TOKENS = 16
CHUNK = 256  # tokens a chunk: two pages of any page size up to 128


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One SGLang server on this GPU, in its own process group (ended with it)."""

    def __init__(self, *argv: str, log: Path) -> None:
        if not MODEL or not Path(MODEL).is_dir():
            pytest.skip("set PREFILL_EXT_BLEND_MODEL to a checkpoint folder")
        port = _port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "sglang.launch_server", "--model-path", MODEL, "--port", str(port)]
        self.proc = subprocess.Popen(
            [*command, "--mem-fraction-static", "0.4", "--page-size", "1", *argv],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if not wait_healthy(self.url, 600):
            self.stop()
            raise RuntimeError(f"the server did not come up: {log}")

    def generate(self, ids: list[int], **fields: Any) -> list[int]:
        sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
        reply = http_json(
            self.url + "/generate", {"input_ids": ids, "sampling_params": sampling, **fields}, 300
        )
        return reply["output_ids"]

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def _serve(tmp_path: Path, name: str, *argv: str) -> Iterator[Server]:
    server = Server(*argv, log=tmp_path / f"{name}.log")
    try:
        yield server
    finally:
        server.stop()


def _prompt(order: str) -> tuple[list[int], list[list[int]]]:
    """A system prompt, chunks A, B, C (distinct token runs) in `order`, a question."""
    system, question = list(range(1000, 1064)), list(range(5000, 5040))
    chunks = {name: list(range(2000 + 400 * i, 2000 + 400 * i + CHUNK)) for i, name in enumerate("ABC")}
    ids, spans = list(system), []
    for name in order:
        spans.append([len(ids), len(ids) + CHUNK])
        ids += chunks[name]
    return ids + question, spans


@pytest.fixture(scope="module")
def flag_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with _serve(tmp_path_factory.mktemp("blend"), "off", "--enable-prefill-ext") as server:
        yield server


def test_flag_off_chunk_spans_change_nothing(flag_off: Server) -> None:
    ids, spans = _prompt("ABC")
    plain = flag_off.generate(ids)
    assert flag_off.generate(ids, chunk_spans=spans) == plain
    assert flag_off.generate(ids, chunk_spans=[[5, 2]]) == plain  # malformed: dropped, as stock drops it
    reordered, spans = _prompt("CAB")
    assert flag_off.generate(reordered, chunk_spans=spans) == flag_off.generate(reordered)


def test_ratio_one_is_the_full_prefill(tmp_path: Path, flag_off: Server) -> None:
    first, spans = _prompt("ABC")
    second, reordered = _prompt("CAB")
    full = flag_off.generate(second)
    argv = ("--enable-prefill-ext", "--prefill-ext-blend", "--prefill-ext-blend-recompute-ratio", "1")
    with _serve(tmp_path, "ratio1", *argv) as server:
        server.generate(first, chunk_spans=spans)  # stores A, B, C
        assert server.generate(second, chunk_spans=reordered) == full


def _reordered(tmp_path: Path, name: str, *argv: str) -> tuple[dict[str, dict[str, Any]], list[int]]:
    """ABC stored, then CAB blended at ratio 0.15 on a server with `argv`: its log lines by rid, and
    CAB's greedy ids."""
    log = tmp_path / f"{name}.jsonl"
    blend = ("--enable-prefill-ext", "--prefill-ext-blend", "--prefill-ext-blend-recompute-ratio", "0.15")
    with _serve(tmp_path, name, *blend, *argv, "--prefill-ext-log", str(log)) as server:
        first, spans = _prompt("ABC")
        server.generate(first, chunk_spans=spans, rid="abc")
        second, reordered = _prompt("CAB")
        ids = server.generate(second, chunk_spans=reordered, rid="cab")
    return {r["rid"]: r for r in map(json.loads, log.read_text().splitlines()) if "rid" in r}, ids


def test_a_reordered_set_runs_the_ratio_s_heads_in_one_pass(tmp_path: Path) -> None:
    """The one pass (fa3: every entry's KV written before the page table is read) against the same
    plan run one extend per pass (a chunk budget of 128 below the prompt's 808 tokens past the match):
    the same greedy ids (bf16: the rows are computed in other batches, so only the ids)."""
    lines, ids = _reordered(tmp_path, "one-pass")
    # the store hit all three: each chunk head (ceil(0.15 * 256) = 39 tokens) and the question, the
    # system prompt matched in the tree
    assert lines["abc"]["chunks"] == 1
    assert lines["abc"]["blend"] == {
        "chunk_tokens": 3 * CHUNK,
        "hits": 0,
        "reused_tokens": 0,
        "recomputed_tokens": 0,
    }
    assert lines["cab"]["chunks"] == 1
    assert lines["cab"]["cached_tokens"] >= 64
    assert lines["cab"]["blend"] == {
        "chunk_tokens": 3 * CHUNK,
        "hits": 3,
        "reused_tokens": 3 * (CHUNK - 39),
        "recomputed_tokens": 3 * 39,
    }
    passes, passes_ids = _reordered(tmp_path, "passes", "--chunked-prefill-size", "128")
    assert passes["cab"]["chunks"] == 4  # a head's pass per chunk, the question's
    assert passes["cab"]["blend"] == lines["cab"]["blend"]
    assert passes_ids == ids


def test_malformed_spans_get_a_400(tmp_path: Path) -> None:
    """On `/generate`, and on `/v1/completions` (a token-id prompt, the spans in the body as the OpenAI
    client's `extra_body` puts them), which serves valid spans."""
    with _serve(tmp_path, "blend", "--enable-prefill-ext", "--prefill-ext-blend") as server:
        ids, spans = _prompt("AB")
        completion = {"model": "default", "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0}
        for send in (
            lambda bad: server.generate(ids, chunk_spans=bad),
            lambda bad: http_json(server.url + "/v1/completions", {**completion, "chunk_spans": bad}, 300),
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                send([[0, 10], [5, 20]])
            assert refused.value.code == 400
            assert "starts before chunk_spans[0] ends (10)" in refused.value.read().decode()
        served = http_json(server.url + "/v1/completions", {**completion, "chunk_spans": spans}, 300)
        assert served["usage"]["prompt_tokens"] == len(ids) and served["choices"]
