"""Serving tier: the real app with a scripted engine (and guard). Asserts exact SSE frames."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gateway.config import Settings
from gateway.main import create_app
from guard.api import GuardPolicy
from tests.doubles import ScriptedEngine, ScriptedGuard

MODEL = "scripted"


def settings() -> Settings:
    # the serving tier injects its guard double; the real monitor is exercised in tests/guard and tests/e2e
    return Settings(guard={"enabled": False})


def make_client(engine: ScriptedEngine, guard: ScriptedGuard | None = None, **kw: Any) -> httpx.AsyncClient:
    app = create_app(settings(), engine=engine, guard=guard, guard_policy=GuardPolicy(enabled=guard is not None), **kw)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def parse_sse(raw: str) -> list[Any]:
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames), frames
    out: list[Any] = []
    for f in frames:
        body = f[len("data: ") :]
        out.append(body if body == "[DONE]" else json.loads(body))
    return out


async def post_stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return parse_sse(r.text)


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, **kw}


async def test_stream_exact_frames() -> None:
    async with make_client(ScriptedEngine()) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body(stream_options={"include_usage": True}))
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    ids = {ch["id"] for ch in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    shapes = [(ch["choices"][0]["delta"] if ch["choices"] else None, ch["choices"][0].get("finish_reason") if ch["choices"] else None) for ch in chunks]
    assert shapes == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hello"}, None),
        ({"content": ","}, None),
        ({"content": " world"}, None),
        ({"content": "!"}, "stop"),
        (None, None),
    ]
    prompt_len = len("<user>hi<assistant>")
    assert chunks[-1]["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": 4, "total_tokens": prompt_len + 4}
    assert all(ch["object"] == "chat.completion.chunk" and ch["model"] == MODEL for ch in chunks)


async def test_max_tokens_gives_length() -> None:
    async with make_client(ScriptedEngine()) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body(max_tokens=2))
        r = await c.post("/v1/chat/completions", json=chat_body(max_tokens=2, stream=False))
    assert [f["choices"][0].get("finish_reason") for f in frames[:-1]] == [None, None, "length"]
    assert frames[-1] == "[DONE]"
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "Hello,"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


async def test_guard_cut_frames_and_abort() -> None:
    engine = ScriptedEngine()
    async with make_client(engine, ScriptedGuard(trigger="world")) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body())
    assert frames[-1] == "[DONE]"
    contents = [f["choices"][0]["delta"].get("content") for f in frames[:-1]]
    assert contents == ["", "Hello", ",", None]
    last = frames[-2]["choices"][0]
    assert last["finish_reason"] == "content_filter"
    assert last["safety"] == {
        "category": "test", "score": 0.8, "threshold": 0.5, "token_offset": 2,
        "features": [{"id": 3, "activation": 2.0}, {"id": 11, "activation": 0.5}],
        "gate": "response", "char_offset": 6, "decision": "intervened", "trigger": "readout",
    }
    # the offending text never reached the client
    assert "world" not in json.dumps(frames)
    assert engine.aborted, "a cut must abort the engine request"


async def test_guard_cut_non_stream() -> None:
    async with make_client(ScriptedEngine(), ScriptedGuard(trigger="world")) as c:
        r = await c.post("/v1/chat/completions", json=chat_body(stream=False))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert choice["message"]["content"] == "Hello,"
    assert choice["safety"]["token_offset"] == 2


async def test_prompt_gate_400() -> None:
    engine = ScriptedEngine()
    async with make_client(engine, ScriptedGuard()) as c:
        r = await c.post("/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": "a forbidden ask"}]))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "content_filter" and err["type"] == "invalid_request_error"
    assert err["safety"]["gate"] == "prompt" and err["safety"]["features"] == [{"id": 7, "activation": 1.5}]
    assert engine.requests == [], "a flagged prompt must never reach the engine"


async def test_guard_disabled_per_request_when_allowed() -> None:
    async with make_client(ScriptedEngine(), ScriptedGuard(trigger="world"), allow_guard_disable=True) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body(guard={"enabled": False}))
    assert frames[-2]["choices"][0]["finish_reason"] == "stop"
    async with make_client(ScriptedEngine(), ScriptedGuard(trigger="world"), allow_guard_disable=False) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body(guard={"enabled": False}))
    assert frames[-2]["choices"][0]["finish_reason"] == "content_filter"


async def test_engine_error_mid_stream_becomes_error_frame_then_done() -> None:
    async with make_client(ScriptedEngine(fail_after=2)) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body())
    assert frames[-1] == "[DONE]"
    assert [f["choices"][0]["delta"].get("content") for f in frames[:3]] == ["", "Hello", ","]
    err = frames[-2]["error"]
    assert err["code"] == "engine_error" and err["type"] == "server_error" and "scripted failure" in err["message"]


async def test_guard_failure_is_error_frame() -> None:
    async with make_client(ScriptedEngine(), ScriptedGuard(fail=True)) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body())
    assert frames[-1] == "[DONE]"
    assert "error" in frames[-2]


async def test_n_choices_are_independent_requests() -> None:
    engine = ScriptedEngine()
    async with make_client(engine) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body(n=2, seed=5))
    by_index: dict[int, str] = {0: "", 1: ""}
    finishes = {}
    for f in frames[:-1]:
        ch = f["choices"][0]
        by_index[ch["index"]] += ch["delta"].get("content") or ""
        if ch.get("finish_reason"):
            finishes[ch["index"]] = ch["finish_reason"]
    assert by_index == {0: "Hello, world!", 1: "Hello, world!"}
    assert finishes == {0: "stop", 1: "stop"}
    assert sorted(o.seed for _, o, _ in engine.requests) == [5, 6]


async def test_disconnect_aborts_engine_request() -> None:
    engine = ScriptedEngine(pieces=["tok"] * 200, delay=0.01)
    app = create_app(settings(), engine=engine)
    body = json.dumps(chat_body()).encode()
    sent: list[bytes] = []
    disconnect = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not getattr(receive, "done", False):
            receive.done = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.body" and msg.get("body"):
            sent.append(msg["body"])
            if len(sent) == 5:
                assert engine.num_running() == 1
                disconnect.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1), "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    assert engine.num_running() == 0
    assert engine.aborted == [engine.requests[0][2]]
    assert len(sent) < 50


async def test_completions_stream_and_echo() -> None:
    async with make_client(ScriptedEngine()) as c:
        frames = await post_stream(c, "/v1/completions", {"model": MODEL, "prompt": "ab", "stream": True, "echo": True, "max_tokens": 3})
        r = await c.post("/v1/completions", json={"model": MODEL, "prompt": ["ab", "c"], "max_tokens": 2})
    assert frames[-1] == "[DONE]"
    assert "".join(f["choices"][0]["text"] for f in frames[:-1]) == "abHello, world"
    assert frames[-2]["choices"][0]["finish_reason"] == "length"
    body = r.json()
    assert [ch["text"] for ch in body["choices"]] == ["Hello,", "Hello,"]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model", "model_not_found"),
        ({"model": MODEL, "messages": []}, 400, "messages", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}, 400, "max_tokens", "context_length_exceeded"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 600}]}, 400, "messages", "context_length_exceeded"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n", "invalid_value"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model", "invalid_value"),
    ],
    ids=["unknown-model", "empty-messages", "bad-type", "bad-role", "max-tokens-too-big", "prompt-too-long", "n-zero", "no-model"],
)
async def test_errors_have_openai_shape(body: dict[str, Any], status: int, param: str, code: str) -> None:
    async with make_client(ScriptedEngine()) as c:
        r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code and err["message"]


async def test_malformed_json_and_huge_body() -> None:
    async with make_client(ScriptedEngine()) as c:
        r = await c.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = await c.post("/v1/chat/completions", content=b"x" * (5 * 1024 * 1024), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


async def test_not_ready_is_503() -> None:
    app = create_app(settings(), engine=None, engine_factory=lambda s: (_ for _ in ()).throw(RuntimeError("no weights")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json=chat_body())
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["type"] == "service_unavailable"
        assert (await c.get("/ready")).status_code == 503
        assert (await c.get("/health")).status_code == 200


async def test_models_and_metrics() -> None:
    async with make_client(ScriptedEngine()) as c:
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["id"] == MODEL
        await post_stream(c, "/v1/chat/completions", chat_body())
        text = (await c.get("/metrics")).text
    assert 'gateway_requests_total{route="chat",status="200"}' in text
    assert "gateway_engine_requests_running 0.0" in text


async def test_include_scores_attaches_risk_per_token() -> None:
    async with make_client(ScriptedEngine(), ScriptedGuard(trigger="zzz")) as c:
        frames = await post_stream(c, "/v1/chat/completions", chat_body(guard={"include_scores": True, "response_threshold": 0.3}))
        plain = await post_stream(c, "/v1/chat/completions", chat_body())
    content = [f["choices"][0] for f in frames[1:-1]]
    assert [ch["risk"] for ch in content] == [[0.1], [0.1], [0.1], [0.1]]
    assert all(ch["threshold"] == 0.3 for ch in content)
    assert all("risk" not in f["choices"][0] for f in plain[:-1])


async def test_guard_endpoints() -> None:
    async with make_client(ScriptedEngine(), ScriptedGuard()) as c:
        m = (await c.post("/v1/moderations", json={"input": ["hello", "a forbidden thing"]})).json()
        assert [r["flagged"] for r in m["results"]] == [False, True]
        assert m["id"].startswith("modr-") and m["results"][1]["category_scores"]["test"] == 0.9
        sc = (await c.post("/v1/guard/score", json={"prompt": "p", "response": "hello world"})).json()
        assert sc["threshold"] == 0.5 and sc["cut"]["token_offset"] == 6 and len(sc["tokens"]) == len(sc["scores"])
        bad = await c.post("/v1/guard/score", json={"prompt": ""})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
        feats = (await c.get("/v1/guard/features")).json()
        assert feats["features"][0]["id"] == 3
    async with make_client(ScriptedEngine()) as c:
        r = await c.post("/v1/moderations", json={"input": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "guard_disabled"
