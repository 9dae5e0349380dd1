"""Real SGLang on the CPU: `sglang.Engine` serving a tiny random Llama (its tokenizer
manager, its scheduler's normal event loop, torch_native attention, float32), for the tests that need a
model forward (tests/runner/test_yield_layers.py). It runs in a subprocess of its own, with
`engine_stubs/` on its path (SGLang off CUDA imports vLLM's rotary kernel, which it never calls there):

    python -m tests.runner.engine_driver RUN.json

RUN.json: {"model": folder, "server": Engine keywords, "rounds": [[[token ids], ...], ...],
"max_new_tokens": N, "flush_rounds": [round index, ...] (optional)}. Each round's prompts go in one
`generate` call (in order: the first is admitted first), one round after the other; while a flush
round's call runs, the cache is flushed over and over (`/flush_cache`, which SGLang grants only while
idle). It prints one JSON line: per round, each prompt's greedy output ids and their logprobs; then,
after the scheduler had time to run its idle check (strict: a leak raises there,
SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE), one more request's output: `alive`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
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


def write_model(folder: Path) -> Path:
    """A random Llama of LAYERS layers (float32, safetensors) in `folder`."""
    from tests.tiny_models import tiny

    model = tiny("llama", num_hidden_layers=LAYERS, vocab_size=VOCAB, max_position_embeddings=4096)
    model.config.torch_dtype = "float32"
    model.save_pretrained(folder)
    return folder


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


async def generate_flushing(engine: Any, prompts: list[list[int]], params: dict[str, Any]) -> list[dict]:
    """`prompts`' outputs, the cache flushed again and again until they came back."""
    outputs = asyncio.ensure_future(
        engine.async_generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    )
    while not outputs.done():
        await engine.tokenizer_manager.flush_cache()
    return await outputs


def main(run_file: str) -> int:
    import sglang

    run = json.loads(Path(run_file).read_text())
    engine = sglang.Engine(**engine_kwargs(run["model"], run["server"]))
    flush_rounds = set(run.get("flush_rounds", ()))
    try:
        params = {"max_new_tokens": run["max_new_tokens"], "temperature": 0.0}
        rounds = [
            engine.loop.run_until_complete(generate_flushing(engine, prompts, params))
            if i in flush_rounds
            else engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
            for i, prompts in enumerate(run["rounds"])
        ]
        time.sleep(IDLE_CHECK_S)
        alive = engine.generate(
            input_ids=[3, 4, 5], sampling_params={"max_new_tokens": 2, "temperature": 0.0}
        )
    finally:
        engine.shutdown()
    result = {
        "outputs": [[out["output_ids"] for out in outs] for outs in rounds],
        "logprobs": [
            [[lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]] for out in outs]
            for outs in rounds
        ],
        "alive": alive["output_ids"],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
