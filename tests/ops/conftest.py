"""Fixtures for the ops tests: a real Redis (unique key prefix per test, removed afterwards) and the real
app with the scripted engine, with the ops layer installed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import Settings
from gateway.main import create_app
from gateway.ops.config import OpsSettings
from gateway.ops.lifecycle import OpsRuntime, install_ops
from gateway.redis_local import reachable
from guard.api import GuardPolicy

REDIS_URL = "redis://127.0.0.1:6379/0"


def dead_redis_url() -> str:
    from tests.conftest import free_port

    return f"redis://127.0.0.1:{free_port()}/0"   # nothing listens there


@pytest.fixture
def redis_url() -> str:
    if not reachable(REDIS_URL):
        pytest.skip("needs a Redis at 127.0.0.1:6379")
    return REDIS_URL


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    import redis

    p = f"ngtest-{uuid.uuid4().hex[:10]}"
    yield p
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{p}:*"))
    if keys:
        r.delete(*keys)
    r.close()


def make_settings(tmp: Path, *, redis_url: str, prefix: str = "ng", **server: Any) -> Settings:
    # guard disabled in the settings: tests inject the scripted guard double when they want one.
    return Settings(
        home=tmp,
        redis={"url": redis_url, "key_prefix": prefix, "embedded": False},
        server=server,
        guard={"enabled": False},
    )


def make_app(
    engine: Any,
    tmp: Path,
    *,
    redis_url: str,
    prefix: str = "ng",
    ops: OpsSettings | None = None,
    guard: Any = None,
    guard_policy: GuardPolicy | None = None,
    **server: Any,
) -> tuple[Any, OpsRuntime]:
    settings = make_settings(tmp, redis_url=redis_url, prefix=prefix, **server)
    ops = ops or OpsSettings()
    if "ops" in type(settings).model_fields:
        settings = settings.model_copy(update={"ops": ops})
    app = create_app(settings, engine=engine, guard=guard, guard_policy=guard_policy or GuardPolicy(enabled=guard is not None))
    rt = getattr(app.state, "ops", None)
    if rt is None:          # until create_app calls install_ops itself
        rt = install_ops(app, settings, ops=ops)
    return app, rt


def client(app: Any, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", headers=headers)


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "stream": True, **kw}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err  # type: ignore[no-any-return]
