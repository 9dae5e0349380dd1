"""HTTP client for a running SGLang server: streamed POST /generate with `input_ids`, each request
timed (`Client`, `Record`), and the untimed calls around it (health, cache flush, server info).

Needs only the standard library and aiohttp (tqdm is optional: progress bars).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

try:  # optional progress bars
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - depends on the host
    _tqdm = None


# --------------------------------------------------------------------------------------------
# HTTP helpers (stdlib, for the non-timed calls)


def http_json(url: str, payload: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read().decode()
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return body


def wait_healthy(url: str, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    return False


def flush_cache(url: str) -> bool:
    """Ask the server to drop its radix cache (it only does so while idle); retries briefly."""
    for _ in range(20):
        try:
            req = urllib.request.Request(url + "/flush_cache", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as resp:
                if resp.status == 200:
                    return True
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, OSError):
            return False
        time.sleep(0.25)
    return False


SERVER_INFO_KEYS = (
    "version",
    "model_path",
    "load_format",
    "attention_backend",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_total_num_tokens",
    "mem_fraction_static",
    "page_size",
    "context_length",
    "disable_radix_cache",
    "disable_prefill_cuda_graph",
    "enable_prefill_ext",
    "prefill_ext_options",
    "max_running_requests",
    "schedule_policy",
)


def server_info(url: str) -> dict[str, Any]:
    for path in ("/server_info", "/get_server_info"):
        try:
            info = http_json(url + path)
        except (urllib.error.URLError, OSError):
            continue
        if isinstance(info, dict):
            return {k: info[k] for k in SERVER_INFO_KEYS if k in info}
    return {}


# --------------------------------------------------------------------------------------------
# One streamed request


@dataclasses.dataclass
class Record:
    label: str
    workload: str
    group: str
    idx: int
    prompt_tokens: int
    max_new_tokens: int
    t_send: float  # seconds since the workload started
    ttft_s: float | None = None
    e2e_s: float | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    reusable_tokens: int = 0  # prefix the client knows an earlier request already sent
    server_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    session: int | None = None
    turn: int | None = None
    rep: int | None = None
    # Time between tokens: the gap before each streamed event that brought new tokens, after the
    # first token (an event bringing several tokens is one gap: what the reader waited).
    tbt_s: list[float] = dataclasses.field(default_factory=list)
    output_ids: list[int] | None = dataclasses.field(default=None, repr=False)

    @property
    def t_first(self) -> float | None:
        return None if self.ttft_s is None else self.t_send + self.ttft_s

    @property
    def t_end(self) -> float | None:
        return None if self.e2e_s is None else self.t_send + self.e2e_s

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("output_ids")
        return d


def _completion_tokens(event: dict[str, Any]) -> int:
    meta = event.get("meta_info") or {}
    if "completion_tokens" in meta:
        return int(meta["completion_tokens"])
    return len(event.get("output_ids") or [])


class Client:
    def __init__(self, url: str, label: str, jsonl: Path | None, progress: bool = True):
        self.url = url.rstrip("/")
        self.label = label
        self.jsonl = jsonl
        self.progress = progress and _tqdm is not None
        self.session: Any = None
        self.records: list[Record] = []
        # requests sent and not yet answered, with their perf_counter send time (a watcher's view)
        self.in_flight: dict[int, tuple[Record, float]] = {}
        self._bar: Any = None

    async def __aenter__(self) -> Client:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=900)
        self.session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0, force_close=False)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    @contextlib.contextmanager
    def bar(self, total: int, desc: str) -> Iterable[None]:
        if self.progress:
            self._bar = _tqdm(total=total, desc=desc, file=sys.stderr, leave=False, mininterval=1.0)
        try:
            yield
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    async def generate(
        self,
        ids: list[int],
        *,
        workload: str,
        group: str,
        idx: int,
        t0: float,
        max_new_tokens: int,
        reusable: int = 0,
        extra_body: dict[str, Any] | None = None,
        **tags: Any,
    ) -> Record:
        """One streamed `/generate` of `ids`; `extra_body`: more request fields (e.g. `chunk_spans`)."""
        rec = Record(
            label=self.label,
            workload=workload,
            group=group,
            idx=idx,
            prompt_tokens=len(ids),
            max_new_tokens=max_new_tokens,
            t_send=0.0,
            reusable_tokens=reusable,
            **tags,
        )
        payload = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
            "stream": True,
            **(extra_body or {}),
        }
        body = json.dumps(payload).encode()
        start = time.perf_counter()
        rec.t_send = start - t0
        output_ids: list[int] = []
        last: dict[str, Any] | None = None
        seen, t_token = 0, start
        self.in_flight[id(rec)] = (rec, start)
        try:
            async with self.session.post(
                self.url + "/generate", data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                else:
                    buf = b""
                    done = False
                    async for chunk in resp.content.iter_any():
                        buf += chunk
                        while b"\n\n" in buf and not done:
                            raw, buf = buf.split(b"\n\n", 1)
                            raw = raw.strip()
                            if not raw.startswith(b"data:"):
                                continue
                            data = raw[5:].strip()
                            if data == b"[DONE]":
                                done = True
                                break
                            event = json.loads(data)
                            if "error" in event:
                                rec.error = str(event["error"])[:500]
                                continue
                            now = time.perf_counter()
                            n_done = _completion_tokens(event)
                            if rec.ttft_s is None and n_done >= 1:
                                rec.ttft_s = now - start
                            elif n_done > seen >= 1:
                                rec.tbt_s.append(now - t_token)
                            if n_done > seen:
                                seen, t_token = n_done, now
                            new_ids = event.get("output_ids") or []
                            # Incremental streaming sends deltas, the default sends the whole list.
                            if len(new_ids) == n_done:
                                output_ids = list(new_ids)
                            else:
                                output_ids.extend(new_ids)
                            last = event
                        if done:
                            break
        except Exception as e:  # network errors, server death: recorded, not raised
            rec.error = f"{type(e).__name__}: {e}"[:500]
        finally:
            self.in_flight.pop(id(rec), None)
        end = time.perf_counter()
        if last is not None:
            meta = last.get("meta_info") or {}
            rec.cached_tokens = meta.get("cached_tokens")
            rec.output_tokens = _completion_tokens(last)
            rec.server_prompt_tokens = meta.get("prompt_tokens")
            fr = meta.get("finish_reason")
            rec.finish_reason = fr.get("type") if isinstance(fr, dict) else fr
            if rec.error is None:
                rec.e2e_s = end - start
        elif rec.error is None:
            rec.error = "no output event"
        rec.output_ids = output_ids
        self.records.append(rec)
        if self.jsonl is not None:
            with open(self.jsonl, "a") as f:
                f.write(json.dumps(rec.to_json()) + "\n")
        if self._bar is not None:
            self._bar.update(1)
        return rec
