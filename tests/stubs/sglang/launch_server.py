"""A stand-in `python -m sglang.launch_server` for the GPU scripts' CPU tests: serves /health, /flush_cache,
/server_info and a streamed /generate whose first token takes 2 us per prompt token; exits 1 at once
when given --fail (a server that does not start)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiohttp import web


async def generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = len(body["input_ids"])
    resp = web.StreamResponse()
    await resp.prepare(request)
    await asyncio.sleep(prompt * 2e-6)
    for k in range(1, body["sampling_params"]["max_new_tokens"] + 1):
        meta = {"completion_tokens": k, "prompt_tokens": prompt, "cached_tokens": 0}
        await resp.write(
            b"data: " + json.dumps({"output_ids": [7] * k, "meta_info": meta}).encode() + b"\n\n"
        )
    await resp.write(b"data: [DONE]\n\n")
    return resp


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunked-prefill-size", type=int, default=8192)
    parser.add_argument("--fail", action="store_true")
    a, _ = parser.parse_known_args()
    if a.fail:
        print("stand-in server: refusing to start (--fail)", file=sys.stderr)
        return 1

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"chunked_prefill_size": a.chunked_prefill_size, "argv": sys.argv[1:]})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", ok)
    app.router.add_post("/flush_cache", ok)
    app.router.add_get("/server_info", info)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
