"""The suite and batch routers mounted on the real gateway app (engine and guard doubles), with the
real Redis and an in-process burst worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.api.routes import batches, suites
from gateway.config import Settings
from gateway.main import create_app
from guard.api import GuardPolicy
from offline_suites.config import SuiteSettings
from offline_suites.worker import build_worker
from tests.conftest import free_port
from tests.doubles import ScriptedEngine, ScriptedGuard

pytestmark = pytest.mark.redis
REDIS_URL = "redis://127.0.0.1:6379/0"


def make_app(aredis: Any, s: SuiteSettings) -> Any:
    app = create_app(Settings(guard={"enabled": False}), engine=ScriptedEngine(),
                     guard=ScriptedGuard(trigger="zzz-never", prompt_trigger="forbidden"),
                     guard_policy=GuardPolicy(enabled=True))
    app.include_router(suites.router)
    app.include_router(batches.router)
    app.state.redis = aredis
    app.state.suite_settings = s
    return app


@pytest.fixture
async def client(aredis: Any, suite_settings: SuiteSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(aredis, suite_settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


async def burst(s: SuiteSettings) -> Any:
    w = build_worker(s, REDIS_URL, burst=True, poll_delay=0.02, handle_signals=False)
    try:
        await w.main()
    finally:
        await w.close()
    return w


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    if code:
        assert err["code"] == code
    return err


async def test_suites_list(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/suites")
    assert r.status_code == 200
    data = {d["name"]: d for d in r.json()["data"]}
    assert {"powerlaw-cot", "fp-equivariance", "repsim", "tableagent", "cgm"} <= set(data)
    assert set(data["cgm"]["presets"]) == {"smoke", "full"} and data["cgm"]["version"] >= 1 and data["cgm"]["description"]


async def test_run_lifecycle_over_the_api(client: httpx.AsyncClient, suite_settings: SuiteSettings) -> None:
    err = assert_openai_error(await client.post("/v1/suites/tableagnt/runs", json={}), 404, "suite_not_found")
    assert "Did you mean: tableagent?" in err["message"]
    assert_openai_error(await client.post("/v1/suites/tableagent/runs", json={"config": {"dialogs": 2}}), 400,
                        "invalid_config")
    body = {"preset": "smoke", "config": {"llm_dialogues": 0, "judge_items": 0, "dialogues": 2}, "seed": 1}
    r = await client.post("/v1/suites/tableagent/runs", json=body)
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "queued" and run["object"] == "suite.run"
    again = await client.post("/v1/suites/tableagent/runs", json=body)
    assert again.status_code == 200 and again.json()["id"] == run["id"]

    await burst(suite_settings)
    got = (await client.get(f"/v1/runs/{run['id']}")).json()
    assert got["status"] == "succeeded" and got["progress"] == 1.0
    assert got["result"]["summary"]["gates_passed"] and "tableworld_manifest.json" in got["artifacts"]
    art = await client.get(f"/v1/runs/{run['id']}/artifacts/tableworld_manifest.json")
    assert art.status_code == 200 and len(json.loads(art.content)) == 2
    assert_openai_error(await client.get(f"/v1/runs/{run['id']}/artifacts/..%2F..%2Fetc%2Fpasswd"), 404)
    assert_openai_error(await client.get("/v1/runs/nope"), 404, "run_not_found")
    listed = (await client.get("/v1/runs")).json()
    assert [d["id"] for d in listed["data"]] == [run["id"]] and "result" not in listed["data"][0]
    # cancelling a finished run changes nothing
    assert (await client.post(f"/v1/runs/{run['id']}/cancel")).json()["status"] == "succeeded"
    assert_openai_error(await client.post("/v1/runs/nope/cancel"), 404)


async def test_batch_through_the_guarded_gateway(aredis: Any, suite_settings: SuiteSettings) -> None:
    """A real HTTP gateway (uvicorn) serves /v1/chat/completions; the worker POSTs every line to it,
    so the prompt gate applies: the 'forbidden' line comes back as a content_filter error."""
    import uvicorn

    port = free_port()
    s = suite_settings.model_copy(update={"api_base_url": f"http://127.0.0.1:{port}/v1"})
    app = make_app(aredis, s)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(100):
            if server.started:
                break
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "scripted", "messages": [{"role": "user", "content": text}], "max_tokens": 8}}
                     for i, text in enumerate(["hello", "something forbidden", "hi again"])]
            payload = ("\n".join(json.dumps(x) for x in lines) + "\n").encode()
            assert_openai_error(await c.post("/v1/files", data={"purpose": "fine-tune"},
                                             files={"file": ("b.jsonl", payload)}), 400, "invalid_purpose")
            bad = payload + json.dumps(lines[0]).encode() + b"\n"          # duplicate custom_id
            assert_openai_error(await c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", bad)}),
                                400, "invalid_file")
            f = (await c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", payload)})).json()
            assert f["object"] == "file" and f["purpose"] == "batch" and f["bytes"] == len(payload)
            assert_openai_error(await c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/embeddings"}),
                                400, "invalid_endpoint")
            b = (await c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                                   "completion_window": "24h"})).json()
            assert b["object"] == "batch" and b["status"] == "validating"

            await burst(s)
            b = (await c.get(f"/v1/batches/{b['id']}")).json()
            assert b["status"] == "completed", b
            assert b["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
            out = [json.loads(x) for x in (await c.get(f"/v1/files/{b['output_file_id']}/content")).text.splitlines()]
            err = [json.loads(x) for x in (await c.get(f"/v1/files/{b['error_file_id']}/content")).text.splitlines()]
            assert sorted(o["custom_id"] for o in out) == ["req-0", "req-2"]
            for o in out:
                assert o["response"]["status_code"] == 200
                assert o["response"]["body"]["choices"][0]["message"]["content"] == "Hello, world!"
            assert [e["custom_id"] for e in err] == ["req-1"]
            assert err[0]["response"]["status_code"] == 400
            assert "content_filter" in json.dumps(err[0]["response"]["body"])
            listed = (await c.get("/v1/batches")).json()
            assert listed["data"][0]["id"] == b["id"]
    finally:
        server.should_exit = True
        await task


async def test_batch_cancelled_before_a_worker_takes_it(client: httpx.AsyncClient, suite_settings: SuiteSettings) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}}
    f = (await client.post("/v1/files", data={"purpose": "batch"},
                           files={"file": ("b.jsonl", (json.dumps(line) + "\n").encode())})).json()
    b = (await client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions"})).json()
    c = (await client.post(f"/v1/batches/{b['id']}/cancel")).json()
    assert c["status"] == "cancelling" and c["cancelling_at"]
    await burst(suite_settings)
    final = (await client.get(f"/v1/batches/{b['id']}")).json()
    assert final["status"] == "cancelled" and final["output_file_id"] is None
    assert_openai_error(await client.get("/v1/batches/batch-nope"), 404, "batch_not_found")


async def test_runs_list_pagination(client: httpx.AsyncClient, suite_settings: SuiteSettings) -> None:
    ids = []
    for seed in range(3):
        r = await client.post("/v1/suites/tableagent/runs", json={"config": {"llm_dialogues": 0, "judge_items": 0}, "seed": seed})
        ids.append(r.json()["id"])
        await asyncio.sleep(0.01)          # distinct creation times order the index
    page1 = (await client.get("/v1/runs", params={"limit": 2})).json()
    assert [d["id"] for d in page1["data"]] == ids[::-1][:2] and page1["has_more"]
    page2 = (await client.get("/v1/runs", params={"limit": 2, "after": page1["last_id"]})).json()
    assert [d["id"] for d in page2["data"]] == [ids[0]] and not page2["has_more"]
