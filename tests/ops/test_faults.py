"""Faults at the edge: bad bodies -> 4xx in the OpenAI shape; timeouts -> in-stream error frame + [DONE];
drain (in process and with a real SIGTERM) lets open streams finish while new work is refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.ops.config import OpsSettings
from inference.types import SamplingOptions, TokenDelta
from tests.conftest import free_port
from tests.doubles import ScriptedEngine
from tests.gateway.test_serving import parse_sse
from tests.ops.conftest import REDIS_URL, assert_openai_error, chat, client, dead_redis_url, make_app


@dataclass
class StallingEngine(ScriptedEngine):
    """Sends ``stall_after`` pieces, then goes silent (a hung upstream)."""

    stall_after: int = 1

    async def generate(self, prompt_token_ids: list[int], options: SamplingOptions, request_id: str) -> AsyncIterator[TokenDelta]:
        async with contextlib.aclosing(super().generate(prompt_token_ids, options, request_id)) as inner:
            n = 0
            async for d in inner:
                if n == self.stall_after:
                    await asyncio.sleep(3600)
                n += 1
                yield d


def app_for(engine: Any, tmp: Path, **server: Any) -> Any:
    app, _ = make_app(engine, tmp, redis_url=dead_redis_url(), ops=OpsSettings(), **server)
    return app


@pytest.mark.parametrize(
    ("raw", "headers", "status"),
    [
        (b'{"model": "scripted", "messages": [', {"content-type": "application/json"}, 400),
        (b"not json at all", {"content-type": "application/json"}, 400),
        (b"[1, 2, 3]", {"content-type": "application/json"}, 400),
        (json.dumps({"model": 5, "messages": "hi"}).encode(), {"content-type": "application/json"}, 400),
        (json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}).encode(),
         {"content-type": "application/json"}, 400),
        (json.dumps({"model": "scripted", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
         {"content-type": "application/json"}, 400),
        (json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}], "n": -1}).encode(),
         {"content-type": "application/json"}, 400),
    ],
)
async def test_bad_bodies_are_4xx_openai_shape(tmp_path: Path, raw: bytes, headers: dict[str, str], status: int) -> None:
    async with client(app_for(ScriptedEngine(), tmp_path)) as c:
        r = await c.post("/v1/chat/completions", content=raw, headers=headers)
    assert_openai_error(r, status)


async def test_huge_bodies_413_with_and_without_content_length(tmp_path: Path) -> None:
    app = app_for(ScriptedEngine(), tmp_path, max_body_bytes=4096)
    big = json.dumps(chat(messages=[{"role": "user", "content": "x" * 10_000}])).encode()

    async def chunked() -> AsyncIterator[bytes]:       # no Content-Length: the cap must still hold
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    async with client(app) as c:
        assert_openai_error(await c.post("/v1/chat/completions", content=big), 413, "request_too_large")
        r = await c.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers
        assert_openai_error(r, 413, "request_too_large")
        assert (await c.post("/v1/chat/completions", json=chat())).status_code == 200


async def _frames(app: Any, body: dict[str, Any]) -> list[Any]:
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return parse_sse(r.text)


async def test_first_token_timeout(tmp_path: Path) -> None:
    engine = ScriptedEngine(delay=0.5)
    frames = await _frames(app_for(engine, tmp_path, first_token_timeout_s=0.1), chat())
    assert frames[-1] == "[DONE]"
    err = frames[-2]["error"]
    assert err["code"] == "first_token_timeout" and err["type"] == "timeout_error"
    assert engine.num_running() == 0 and len(engine.aborted) == 1


async def test_idle_timeout_after_some_tokens(tmp_path: Path) -> None:
    engine = StallingEngine(stall_after=2)
    t0 = time.monotonic()
    frames = await _frames(app_for(engine, tmp_path, idle_token_timeout_s=0.2), chat())
    assert time.monotonic() - t0 < 2
    contents = [f["choices"][0]["delta"].get("content") for f in frames[:-2] if "choices" in f and f["choices"]]
    assert contents == ["", "Hello", ","]             # what was generated before the stall was delivered
    assert frames[-2]["error"]["code"] == "idle_timeout" and frames[-1] == "[DONE]"
    assert engine.num_running() == 0


async def test_total_timeout_streamed_and_not(tmp_path: Path) -> None:
    engine = ScriptedEngine(pieces=[f"p{i}" for i in range(50)], delay=0.02)
    app = app_for(engine, tmp_path, request_timeout_s=0.3)
    frames = await _frames(app, chat())
    assert frames[-2]["error"]["code"] == "request_timeout" and frames[-1] == "[DONE]"
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(stream=False))
    assert_openai_error(r, 504, "request_timeout")
    assert engine.num_running() == 0


async def test_drain_refuses_new_work_and_finishes_open_streams(tmp_path: Path) -> None:
    engine = ScriptedEngine(pieces=[f"p{i} " for i in range(20)], delay=0.02)
    app, rt = make_app(engine, tmp_path, redis_url=dead_redis_url(), ops=OpsSettings())
    async with client(app) as c:
        open_stream = asyncio.create_task(c.post("/v1/chat/completions", json=chat()))
        await asyncio.sleep(0.1)
        rt.begin_drain()
        r = await c.post("/v1/chat/completions", json=chat())
        assert_openai_error(r, 503, "server_shutting_down")
        assert r.headers["Retry-After"] == "1"
        assert (await c.get("/ready")).status_code == 503
        assert (await c.get("/health")).status_code == 200
        done = await open_stream
    frames = parse_sse(done.text)
    assert frames[-1] == "[DONE]" and frames[-2]["choices"][0]["finish_reason"] == "stop"
    assert sum(1 for f in frames[:-1] if f["choices"] and f["choices"][0]["delta"].get("content")) == 20


@pytest.mark.slow
async def test_sigterm_drains_in_flight_stream(tmp_path: Path) -> None:
    """A real process: SIGTERM arrives mid-stream; the stream still completes with all 40 pieces and [DONE],
    new connections are refused, and the process exits on its own."""
    port = free_port()
    script = Path(__file__).with_name("scripted_server.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script), str(port), str(tmp_path), REDIS_URL], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get("/ready")).status_code == 200:
                        break
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                await asyncio.sleep(0.1)
            pieces = 0
            done = False
            signalled_at = None
            async with c.stream("POST", "/v1/chat/completions", json=chat()) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                        break
                    if '"content":"p' in line:
                        pieces += 1
                        if pieces == 3:
                            proc.send_signal(signal.SIGTERM)
                            signalled_at = time.monotonic()
                            await asyncio.sleep(0.3)
                            with pytest.raises(httpx.HTTPError):     # listener closed: no new work
                                async with httpx.AsyncClient(base_url=base, timeout=2) as fresh:
                                    await fresh.get("/health")
        assert done and pieces == 40
        assert signalled_at is not None
        rc = await asyncio.to_thread(proc.wait, 30)
        assert rc in (0, -signal.SIGTERM)     # uvicorn re-raises the captured signal after a clean shutdown
        log = proc.stdout.read().decode() if proc.stdout else ""
        assert "drain" in log and "Finished server process" in log, log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
