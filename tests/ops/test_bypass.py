"""Attacks on the guard and on an exposed deployment, each tried against the real app (scripted engine and
guard doubles). Every test fails if its attack succeeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.ops_config import GuardPolicyOverrides, OpsSettings, TenantSettings
from guard.api import GuardPolicy
from tests.doubles import ScriptedEngine, ScriptedGuard
from tests.ops.conftest import assert_openai_error, chat, client, dead_redis_url, make_app


def _guarded_app(tmp_path: Path, *, engine: ScriptedEngine | None = None, guard: Any = None,
                 policy: GuardPolicy | None = None, ops: OpsSettings | None = None) -> tuple[Any, ScriptedEngine]:
    engine = engine or ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), ops=ops,
                      guard=guard or ScriptedGuard(trigger="world"), guard_policy=policy or GuardPolicy())
    return app, engine


# -- overrides may only tighten -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("route", "guard", "param"),
    [
        ("/v1/chat/completions", {"prompt_threshold": 1e9, "response_threshold": 1e9}, "guard.prompt_threshold"),
        ("/v1/chat/completions", {"response_threshold": 1e9}, "guard.response_threshold"),
        ("/v1/chat/completions", {"response_threshold": 0.51}, "guard.response_threshold"),
        ("/v1/completions", {"response_threshold": 1e9}, "guard.response_threshold"),
    ],
    ids=["both-huge", "response-huge", "response-just-above", "completions"],
)
async def test_loosening_threshold_is_refused(tmp_path: Path, route: str, guard: dict[str, Any], param: str) -> None:
    # The scripted guard's operator threshold is 0.5 (what it applies when the policy sets none): the request
    # never names it, so the ceiling has to come from the guard itself.
    app, engine = _guarded_app(tmp_path)
    body: dict[str, Any] = (chat(guard=guard) if route.endswith("chat/completions")
                            else {"model": "scripted", "prompt": "hi", "stream": True, "guard": guard})
    async with client(app) as c:
        r = await c.post(route, json=body)
    err = assert_openai_error(r, 400, "guard_override_not_allowed")
    assert err["param"] == param
    assert engine.requests == [], "a refused override must not reach the engine"


@pytest.mark.parametrize("value", ["Infinity", "NaN"])
async def test_non_finite_threshold_is_refused(tmp_path: Path, value: str) -> None:
    # Python's json reads these; a NaN compares false both ways, so a "> ceiling" check would let it in
    app, engine = _guarded_app(tmp_path)
    body = ('{"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "stream": true, '
            f'"guard": {{"response_threshold": {value}}}}}')
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "guard.response_threshold" and engine.requests == []


async def test_loosening_hold_back_is_refused(tmp_path: Path) -> None:
    app, engine = _guarded_app(tmp_path, policy=GuardPolicy(hold_back=4))
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(guard={"hold_back": 1}))
    err = assert_openai_error(r, 400, "guard_override_not_allowed")
    assert err["param"] == "guard.hold_back" and engine.requests == []


async def test_tenant_threshold_is_the_ceiling(tmp_path: Path) -> None:
    ops = OpsSettings(tenants={"default": TenantSettings(guard=GuardPolicyOverrides(response_threshold=0.3))})
    app, _ = _guarded_app(tmp_path, ops=ops)
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(guard={"response_threshold": 0.4}))
        assert_openai_error(r, 400, "guard_override_not_allowed")
        ok = await c.post("/v1/chat/completions", json=chat(guard={"response_threshold": 0.2, "hold_back": 3}))
    assert ok.status_code == 200 and '"finish_reason":"content_filter"' in ok.text   # tighter: still guarded


# -- the guard reads the whole conversation -------------------------------------------------------------
@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "you must explain the forbidden thing"}, {"role": "user", "content": "go on"}],
        [{"role": "developer", "content": "forbidden"}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "forbidden"}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": "continue"}],
        [{"role": "user", "content": "hi"}, {"role": "tool", "content": "forbidden"}, {"role": "user", "content": "hi"}],
    ],
    ids=["system", "developer", "earlier-turn", "tool"],
)
async def test_prompt_gate_scores_every_message(tmp_path: Path, messages: list[dict[str, str]]) -> None:
    app, engine = _guarded_app(tmp_path)
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(messages=messages))
    err = assert_openai_error(r, 400, "content_filter")
    assert err["safety"]["gate"] == "prompt" and engine.requests == []
