"""Attacks on the guard and on an exposed deployment, each tried against the real app (scripted engine and
guard doubles). Every test fails if its attack succeeds."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from gateway.ops.config import AuditSettings, AuthSettings, GuardPolicyOverrides, OpsSettings, TenantSettings
from guard.api import GuardPolicy
from tests.doubles import ScriptedEngine, ScriptedGuard
from tests.ops.conftest import assert_openai_error, chat, client, dead_redis_url, make_app


def _guarded_app(tmp_path: Path, *, engine: ScriptedEngine | None = None, guard: Any = None,
                 policy: GuardPolicy | None = None, ops: OpsSettings | None = None, **server: Any) -> tuple[Any, Any]:
    """The app with the scripted guard (cuts at "world", flags prompts with "forbidden") and no Redis;
    returns it with the engine, whose requests show whether anything reached the model."""
    engine = engine or ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), ops=ops,
                      guard=guard or ScriptedGuard(trigger="world"), guard_policy=policy or GuardPolicy(), **server)
    return app, engine


def _refused_before_any_output(engine: ScriptedEngine, overlap: bool) -> None:
    """A refused prompt: gate first, the engine never saw it; overlapped, whatever started beside the gate
    was stopped (nothing is left running; the client got the refusal and nothing else)."""
    if overlap:
        assert engine.num_running() == 0
        assert all(rid in engine.aborted for _, _, rid in engine.requests)
    else:
        assert engine.requests == []


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


# -- switching the guard off is a per-tenant grant, audited ---------------------------------------------
def _audit_lines(rt: Any) -> list[dict[str, Any]]:
    assert rt.audit is not None and rt.audit.path is not None
    return [json.loads(x) for x in rt.audit.path.read_text().splitlines()] if rt.audit.path.exists() else []


async def _keys_cli(redis_url: str, prefix: str, *argv: str) -> int:
    """``nextguard keys ...`` as the operator runs it (its own event loop, hence a thread here)."""
    from gateway.ops.cli import add_subcommands

    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["keys", "--redis-url", redis_url, "--prefix", prefix, "--json", *argv])
    return int(await asyncio.to_thread(args.func, args))


async def test_guard_disable_is_off_by_default(tmp_path: Path) -> None:
    assert Settings(guard={"enabled": False}).allow_guard_disable is False
    # nothing passed for allow_guard_disable: the deployment default applies (Redis down: no grant either)
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), guard=ScriptedGuard(trigger="world"),
                       guard_policy=GuardPolicy())
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(guard={"enabled": False}))
        rc = await c.post("/v1/completions", json={"model": "scripted", "prompt": "hi", "guard": {"enabled": False}})
    assert r.status_code == 200 and '"finish_reason":"content_filter"' in r.text
    assert rc.status_code == 200 and rc.json()["choices"][0]["finish_reason"] == "content_filter"
    lines = _audit_lines(rt)
    assert [(x["decision"], x["guard_overrides"]) for x in lines] == [("intervened", {"enabled": False})] * 2


@pytest.mark.redis
async def test_guard_disable_needs_the_tenants_grant(tmp_path: Path, redis_url: str, prefix: str) -> None:
    ops = OpsSettings(auth=AuthSettings(enabled=True, cache_ttl_s=0.0))
    engine = ScriptedEngine()
    app, rt = make_app(engine, tmp_path, redis_url=redis_url, prefix=prefix, ops=ops,
                       guard=ScriptedGuard(trigger="world"), guard_policy=GuardPolicy())
    assert rt.keys is not None
    acme, acme_rec = await rt.keys.create("acme")
    beta, _ = await rt.keys.create("beta")
    off = chat(guard={"enabled": False})

    async def finish(key: str) -> str:
        async with client(app, key) as c:
            r = await c.post("/v1/chat/completions", json=off)
        assert r.status_code == 200, r.text
        return "content_filter" if '"finish_reason":"content_filter"' in r.text else "stop"

    assert await finish(acme) == "content_filter"             # not granted yet
    assert await _keys_cli(redis_url, prefix, "grant", "--tenant", "acme", "guard_disable") == 0
    assert await finish(acme) == "stop"                       # granted: unguarded
    assert rt.grants is not None and await rt.grants.list() == {"acme": ["guard_disable"]}
    assert await finish(beta) == "content_filter"             # another tenant is not
    assert await _keys_cli(redis_url, prefix, "ungrant", "--tenant", "acme", "guard_disable") == 0
    assert await finish(acme) == "content_filter"             # taken back (cache_ttl_s=0)

    lines = _audit_lines(rt)
    assert [(x["tenant"], x["decision"]) for x in lines] == [
        ("acme", "intervened"), ("acme", "guard_disabled"), ("beta", "intervened"), ("acme", "intervened")]
    assert all(x["guard_overrides"] == {"enabled": False} for x in lines)
    assert lines[1]["key_id"] == acme_rec.id and lines[1]["gate"] is None


async def test_every_override_is_audited(tmp_path: Path) -> None:
    # passes are not logged here, yet a tightened pass and a refused loosening both are
    ops = OpsSettings(audit=AuditSettings(log_passes=False))
    app, _ = _guarded_app(tmp_path, guard=ScriptedGuard(trigger="never-said"), ops=ops)
    rt = app.state.ops
    async with client(app) as c:
        assert (await c.post("/v1/chat/completions", json=chat())).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat(guard={"response_threshold": 0.1}))).status_code == 200
        refused = await c.post("/v1/chat/completions", json=chat(guard={"prompt_threshold": 2.0}))
    assert refused.status_code == 400
    lines = _audit_lines(rt)
    assert [(x["decision"], x.get("guard_overrides"), x.get("param")) for x in lines] == [
        ("pass", {"response_threshold": 0.1}, None),
        ("override_refused", {"prompt_threshold": 2.0}, "guard.prompt_threshold"),
    ]


# -- fan-out, guard waits, tokenising -------------------------------------------------------------------
def _completion(prompt: Any, **kw: Any) -> dict[str, Any]:
    return {"model": "scripted", "prompt": prompt, "max_tokens": 4, **kw}


async def test_fan_out_is_bounded(tmp_path: Path) -> None:
    engine = ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), max_prompts_per_request=4,
                      max_choices_per_prompt=2)
    async with client(app) as c:
        many = await c.post("/v1/completions", json=_completion(["hi"] * 5))
        wide = await c.post("/v1/completions", json=_completion("hi", n=3))
        chat_wide = await c.post("/v1/chat/completions", json=chat(n=3))
        ok = await c.post("/v1/completions", json=_completion(["hi"] * 4, n=2))
    assert assert_openai_error(many, 400, "too_many_prompts")["param"] == "prompt"
    assert assert_openai_error(wide, 400, "too_many_choices")["param"] == "n"
    assert assert_openai_error(chat_wide, 400, "too_many_choices")["param"] == "n"
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
    assert len(engine.requests) == 8           # only the accepted request reached the engine


async def test_each_choice_takes_an_admission_slot(tmp_path: Path) -> None:
    engine = ScriptedEngine(delay=0.2)
    ops = OpsSettings(tenants={"default": TenantSettings(max_in_flight=4)})
    app, rt = make_app(engine, tmp_path, redis_url=dead_redis_url(), ops=ops)
    async with client(app) as c:
        over = await c.post("/v1/completions", json=_completion(["a", "b", "c"], n=2))
        assert assert_openai_error(over, 400, "too_many_choices")["param"] == "n"
        first = asyncio.create_task(c.post("/v1/completions", json=_completion(["a", "b", "c"])))
        for _ in range(100):
            if rt.in_flight == 3:
                break
            await asyncio.sleep(0.01)
        assert rt.in_flight == 3                # one slot per choice, not one per request
        second = await c.post("/v1/chat/completions", json=chat(n=2))
        assert_openai_error(second, 429, "rate_limit_exceeded")
        assert second.headers["retry-after"]
        assert (await first).status_code == 200
    assert rt.in_flight == 0                    # every slot came back


class _BusyGuard(ScriptedGuard):
    """Every guard slot is taken: the prompt gate never gets to score."""

    async def check_prompt(self, conversation: Any, policy: GuardPolicy) -> Any:
        await asyncio.Event().wait()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "gate-first"])
async def test_busy_guard_answers_503_with_retry_after(tmp_path: Path, overlap: bool) -> None:
    engine = ScriptedEngine(delay=0.05)
    app, rt = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=_BusyGuard(), guard_policy=GuardPolicy(),
                       guard_wait_timeout_s=0.2, overlap_prompt_gate=overlap)
    async with client(app) as c:
        r = await asyncio.wait_for(c.post("/v1/chat/completions", json=chat()), 5)
    err = assert_openai_error(r, 503, "guard_busy")
    assert "retry" in err["message"] and int(r.headers["retry-after"]) >= 1
    assert rt.in_flight == 0
    _refused_before_any_output(engine, overlap)


class _ThreadNotingEngine(ScriptedEngine):
    threads: list[str] = []

    def apply_chat_template(self, messages: Any, *, add_generation_prompt: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


async def test_big_inputs_are_tokenised_off_the_event_loop(tmp_path: Path) -> None:
    engine = _ThreadNotingEngine(max_model_len=1 << 20)
    engine.threads = []
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), tokenize_inline_chars=1000)
    loop_thread = threading.current_thread().name
    async with client(app) as c:
        assert (await c.post("/v1/chat/completions", json=chat())).status_code == 200
        big = chat(messages=[{"role": "user", "content": "x" * 5000}])
        assert (await c.post("/v1/chat/completions", json=big)).status_code == 200
    assert engine.threads[0] == loop_thread and engine.threads[1] != loop_thread


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
@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "gate-first"])
async def test_prompt_gate_scores_every_message(tmp_path: Path, messages: list[dict[str, str]], overlap: bool) -> None:
    app, engine = _guarded_app(tmp_path, engine=ScriptedEngine(delay=0.05), overlap_prompt_gate=overlap)
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(messages=messages))
    err = assert_openai_error(r, 400, "content_filter")
    assert err["safety"]["gate"] == "prompt"
    _refused_before_any_output(engine, overlap)


class _SlowPromptGate(ScriptedGuard):
    """Takes a while over the prompt, as a real monitor's forward does."""

    async def check_prompt(self, conversation: Any, policy: GuardPolicy) -> Any:
        await asyncio.sleep(0.3)
        return await super().check_prompt(conversation, policy)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "gate-first"])
async def test_generation_overlaps_the_prompt_gate_and_a_refusal_stops_it(tmp_path: Path, route: str,
                                                                          overlap: bool) -> None:
    """Overlapped, the engine starts while the prompt gate still scores (so the gate's time hides behind
    the prefill) and a refusal aborts it mid-generation; gate first, a refused prompt never reaches it. A
    passed prompt streams the same text either way."""
    engine = ScriptedEngine(delay=0.05, pieces=[f" w{i}" for i in range(20)])     # 1 s of generation
    app, _ = _guarded_app(tmp_path, engine=engine, guard=_SlowPromptGate(trigger="never-said"),
                          overlap_prompt_gate=overlap)

    def body(text: str) -> dict[str, Any]:
        if route == "/v1/completions":
            return {"model": "scripted", "prompt": text, "stream": True, "max_tokens": 20}
        return chat(messages=[{"role": "user", "content": text}])

    async with client(app) as c:
        refused = await c.post(route, json=body("forbidden thing"))
        assert assert_openai_error(refused, 400, "content_filter")["safety"]["gate"] == "prompt"
        if overlap:
            assert len(engine.requests) == 1            # it had started before the gate answered ...
            assert engine.aborted == [engine.requests[0][2]]   # ... and the refusal stopped it
        _refused_before_any_output(engine, overlap)
        n_before = len(engine.requests)
        ok = await c.post(route, json=body("hi"))
    assert ok.status_code == 200 and len(engine.requests) == n_before + 1
    from tests.gateway.test_serving import parse_sse

    frames = parse_sse(ok.text)
    assert frames[-1] == "[DONE]"
    text = "".join((f["choices"][0].get("delta") or {}).get("content") or f["choices"][0].get("text") or ""
                   for f in frames[:-1] if f["choices"])
    assert text == "".join(engine.pieces)


# -- an exposed deployment is safe by default -----------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def test_serve_refuses_an_exposed_address_without_auth(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import _serve, exposure_problem

    args = argparse.Namespace(host="0.0.0.0", port=None, model=None, insecure_no_auth=False)
    assert _serve(args) == 2                      # refused before anything loads or binds
    assert "--insecure-no-auth" in capsys.readouterr().err
    for host in ("0.0.0.0", "::", "10.0.0.5", "gateway.example.com"):
        assert exposure_problem(host, auth_enabled=False) is not None, host
        assert exposure_problem(host, auth_enabled=True) is None, host
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert exposure_problem(host, auth_enabled=False) is None, host


def test_image_runs_unprivileged_with_keys_on() -> None:
    lines = [x.strip() for x in (ROOT / "Dockerfile").read_text().splitlines()]
    users = [x.split()[1] for x in lines if x.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert lines.index(next(x for x in lines if x.startswith("USER "))) < lines.index(
        next(x for x in lines if x.startswith("CMD ")))
    assert any("NEXTGUARD_OPS__AUTH__ENABLED=true" in x for x in lines)


class _DyingEngine(ScriptedEngine):
    alive: bool = True

    @property
    def ready(self) -> bool:
        return self.alive


async def test_dead_engine_fails_liveness_and_exits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.main as main

    engine = _DyingEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url())
    async with client(app) as c:
        assert (await c.get("/health")).status_code == 200
        engine.alive = False
        r = await c.get("/health")
    assert r.status_code == 503 and r.json()["checks"]["engine"] is False
    # served by `nextguard serve`: the process drains and exits, so the supervisor restarts it
    kills: list[int] = []
    monkeypatch.setattr(main, "ENGINE_WATCH_S", 0.01)
    monkeypatch.setattr(main.os, "kill", lambda pid, sig: kills.append(sig))
    served = main.create_app(app.state.settings, engine=engine, exit_on_dead_engine=True)
    async with served.router.lifespan_context(served):
        for _ in range(200):
            if kills:
                break
            await asyncio.sleep(0.01)
    assert kills == [signal.SIGTERM]


async def test_ready_does_not_echo_the_load_error(tmp_path: Path) -> None:
    from gateway.main import create_app
    from tests.ops.conftest import make_settings

    def broken(settings: Any) -> Any:
        raise RuntimeError("cannot open /secret/path with token hf_abc123")

    app = create_app(make_settings(tmp_path, redis_url=dead_redis_url()), engine_factory=broken)
    async with app.router.lifespan_context(app):
        for _ in range(200):
            if app.state.engine_error:
                break
            await asyncio.sleep(0.01)
        async with client(app) as c:
            ready = await c.get("/ready")
            health = await c.get("/health")
    assert ready.status_code == 503 and health.status_code == 503
    assert "secret" not in ready.text and "hf_abc123" not in ready.text and ready.json()["error"]


async def test_runs_with_redis_down_answer_503_naming_the_queue(tmp_path: Path) -> None:
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url())
    async with client(app) as c:
        r = await asyncio.wait_for(c.get("/v1/runs"), 10)
    err = assert_openai_error(r, 503, "queue_unavailable")
    assert "nextguard:suites:queue" in err["message"] and int(r.headers["retry-after"]) >= 1


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_stop_strings_are_bounded(tmp_path: Path, route: str) -> None:
    engine = ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url())
    stop = ["x" * 257]
    body = chat(stop=stop) if route.endswith("chat/completions") else _completion("hi", stop=stop)
    async with client(app) as c:
        r = await c.post(route, json=body)
        ok = await c.post(route, json={**body, "stop": "x" * 256})
    assert assert_openai_error(r, 400)["param"] == "stop" and ok.status_code == 200


@pytest.mark.redis
async def test_worker_never_unpickles_a_job(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """Anything that can write Redis could queue a pickle; the worker must not execute it."""
    import pickle
    import time

    import redis.asyncio as aioredis
    from arq.constants import job_key_prefix

    from offline_suites.config import SuiteSettings
    from offline_suites.jobs import job_deserializer, job_serializer
    from offline_suites.keys import Keys
    from offline_suites.worker import build_worker

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    s = SuiteSettings(key_prefix=f"{prefix}:suites:", results_dir=tmp_path / "results")
    keys = Keys(s.key_prefix)
    r = aioredis.Redis.from_url(redis_url)
    job_id = keys.job_id("evil")
    job = {"t": 1, "f": "run_suite", "a": [Payload()], "k": {}, "et": int(time.time() * 1000)}
    await r.set(job_key_prefix + job_id, pickle.dumps(job))
    await r.zadd(keys.queue, {job_id: job["et"]})   # arq reads a score of 0 as "not queued"
    w = build_worker(s, redis_url, burst=True, poll_delay=0.02, handle_signals=False)
    try:
        await w.main()
    finally:
        await w.close()
        await r.delete(job_key_prefix + job_id)
        async for k in r.scan_iter(match=f"arq:*{prefix}*"):
            await r.delete(k)
        await r.aclose()
    assert w.jobs_failed == 1 and not marker.exists()     # read, refused, never unpickled
    assert job_deserializer(job_serializer({"a": ["run-1"], "t": 1})) == {"a": ["run-1"], "t": 1}


def test_compose_keeps_secrets_and_internals_off_the_network() -> None:
    import yaml

    c = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services, nets = c["services"], c["networks"]
    assert nets["internal"]["internal"] is True
    redis = services["redis"]
    assert "--requirepass" in " ".join(redis["command"]) and "ports" not in redis
    assert redis["networks"] == ["internal"]
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${NEXTGUARD_REDIS_PASSWORD:?")
    grafana = services["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")   # no admin/admin
    for name in ("prometheus", "grafana"):
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name
    env_example = (ROOT / "deploy" / "env.example").read_text()
    assert "NEXTGUARD_REDIS_PASSWORD=" in env_example and "GRAFANA_ADMIN_PASSWORD=" in env_example
    subnet = nets["internal"]["ipam"]["config"][0]["subnet"]
    assert json.loads(services["gateway"]["environment"]["NEXTGUARD_OPS__AUTH__METRICS_NETWORKS"]) == [subnet]
    lb = (ROOT / "deploy" / "nginx" / "nextguard-lb.conf").read_text()
    assert "location = /metrics" in lb
    (retry,) = [x for x in lb.splitlines() if x.strip().startswith("proxy_next_upstream ")]
    assert "timeout" not in retry            # a slow POST is never replayed on the other replica
    assert "non_idempotent" not in retry     # nor any POST that reached a replica (nginx's default)


@pytest.mark.redis
async def test_identical_run_of_another_tenant_is_its_own(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """Run ids used to be content hashes: a second tenant submitting the same run became its co-owner and
    could cancel it."""
    import redis.asyncio as aioredis

    from offline_suites.config import SuiteSettings
    from offline_suites.keys import Keys

    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=redis_url, prefix=prefix,
                       ops=OpsSettings(auth=AuthSettings(enabled=True, cache_ttl_s=0.0)))
    s = SuiteSettings(key_prefix=f"{prefix}:suites:", results_dir=tmp_path / "results")
    app.state.suite_settings = s
    app.state.redis = aioredis.Redis.from_url(redis_url)
    run = {"preset": "smoke", "config": {"llm_dialogues": 0, "dialogues": 2}}     # queued only
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    try:
        async with client(app, key_a) as a, client(app, key_b) as b:
            ra = await a.post("/v1/suites/tableagent/runs", json=run)
            rb = await b.post("/v1/suites/tableagent/runs", json=run)
            assert ra.status_code == 201 and rb.status_code == 201, (ra.text, rb.text)
            a_id, b_id = ra.json()["id"], rb.json()["id"]
            assert a_id != b_id
            assert (await a.post("/v1/suites/tableagent/runs", json=run)).json()["id"] == a_id   # A's, again
            assert_openai_error(await b.post(f"/v1/runs/{a_id}/cancel"), 404, "run_not_found")
            assert (await a.get(f"/v1/runs/{a_id}")).json()["cancel_requested"] is False
            # an explicit idempotency key: the same key is the same run, reused for another run a 409
            h = {"Idempotency-Key": "nightly-2026-12-03"}
            k1 = await a.post("/v1/suites/tableagent/runs", json={**run, "seed": 5}, headers=h)
            k2 = await a.post("/v1/suites/tableagent/runs", json={**run, "seed": 5}, headers=h)
            assert k1.status_code == 201 and k2.status_code == 200 and k1.json()["id"] == k2.json()["id"]
            assert k1.json()["id"] not in (a_id, b_id)
            clash = await a.post("/v1/suites/tableagent/runs", json={**run, "seed": 6}, headers=h)
            assert assert_openai_error(clash, 409, "idempotency_key_reused")["param"] == "Idempotency-Key"
            kb = await b.post("/v1/suites/tableagent/runs", json={**run, "seed": 5}, headers=h)
            assert kb.status_code == 201 and kb.json()["id"] != k1.json()["id"]          # keys are per tenant
    finally:
        await app.state.redis.aclose()
        import redis

        r = redis.Redis.from_url(redis_url)
        for pat in Keys(s.key_prefix).patterns():
            keys = list(r.scan_iter(match=pat, count=1000))
            if keys:
                r.delete(*keys)
        r.close()


async def test_metrics_answer_only_the_internal_network(tmp_path: Path) -> None:
    import httpx

    ops = OpsSettings(auth=AuthSettings(metrics_networks=("172.31.250.0/24",)))
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), ops=ops)

    async def scrape(peer: str, **headers: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.get("/metrics", headers=headers)

    assert (await scrape("172.31.250.7")).status_code == 200
    assert (await scrape("203.0.113.9")).status_code == 404
    assert (await scrape("203.0.113.9", **{"X-Forwarded-For": "172.31.250.7"})).status_code == 404
    assert (await scrape("127.0.0.1")).status_code == 404


# -- per-tenant quotas on the jobs API, and deleting files ----------------------------------------------
def _jobs_app(tmp_path: Path, redis_url: str, prefix: str, **suites: Any) -> tuple[Any, Any, Any]:
    import redis.asyncio as aioredis

    from offline_suites.config import SuiteSettings

    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=redis_url, prefix=prefix,
                       ops=OpsSettings(auth=AuthSettings(enabled=True, cache_ttl_s=0.0)))
    s = SuiteSettings(key_prefix=f"{prefix}:suites:", results_dir=tmp_path / "results", **suites)
    app.state.suite_settings = s
    app.state.redis = aioredis.Redis.from_url(redis_url)
    return app, rt, s


async def _drop_jobs_keys(app: Any, redis_url: str, s: Any) -> None:
    import redis

    from offline_suites.keys import Keys

    await app.state.redis.aclose()
    r = redis.Redis.from_url(redis_url)
    for pat in Keys(s.key_prefix).patterns():
        keys = list(r.scan_iter(match=pat, count=1000))
        if keys:
            r.delete(*keys)
    r.close()


def _batch_file(n: int = 1, text: str = "hi") -> bytes:
    return "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "scripted", "messages": [{"role": "user", "content": text}]}}) + "\n"
                   for i in range(n)).encode()


@pytest.mark.redis
async def test_uploads_are_bounded_per_tenant(tmp_path: Path, redis_url: str, prefix: str) -> None:
    app, rt, s = _jobs_app(tmp_path, redis_url, prefix, tenant_max_files=2, tenant_max_file_bytes=4000)
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    small, big = _batch_file(1), _batch_file(40)
    assert len(small) < 200 and len(big) > 4000
    try:
        async with client(app, key_a) as a, client(app, key_b) as b:
            async def up(c: Any, data: bytes) -> Any:
                return await c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", data)})

            err = assert_openai_error(await up(a, big), 429, "file_bytes_quota_exceeded")
            assert err["param"] == "suites.tenant_max_file_bytes" and "4000" in err["message"]
            f1, f2 = (await up(a, small)).json(), (await up(a, small)).json()
            err = assert_openai_error(await up(a, small), 429, "file_count_quota_exceeded")
            assert err["param"] == "suites.tenant_max_files" and "suites.tenant_max_files = 2" in err["message"]
            assert (await up(b, small)).status_code == 200          # the quota is per tenant
            # another tenant cannot delete A's file (404, as unknown); the owner can, and the slot comes back
            assert_openai_error(await b.delete(f"/v1/files/{f1['id']}"), 404, "file_not_found")
            assert (await a.get(f"/v1/files/{f1['id']}")).status_code == 200
            d = await a.delete(f"/v1/files/{f1['id']}")
            assert d.status_code == 200 and d.json() == {"id": f1["id"], "object": "file", "deleted": True}
            assert_openai_error(await a.get(f"/v1/files/{f1['id']}"), 404, "file_not_found")
            assert_openai_error(await a.delete(f"/v1/files/{f1['id']}"), 404, "file_not_found")
            assert not (s.results_dir / "files" / f1["id"]).exists()
            assert (await up(a, small)).status_code == 200
            assert (await a.get(f"/v1/files/{f2['id']}/content")).content == small
    finally:
        await _drop_jobs_keys(app, redis_url, s)


@pytest.mark.redis
async def test_queued_submissions_are_bounded_per_tenant(tmp_path: Path, redis_url: str, prefix: str) -> None:
    app, rt, s = _jobs_app(tmp_path, redis_url, prefix, tenant_max_queued_jobs=2)
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    run = {"preset": "smoke", "config": {"llm_dialogues": 0, "dialogues": 2}}     # queued only: no worker here
    try:
        async with client(app, key_a) as a, client(app, key_b) as b:
            r1 = await a.post("/v1/suites/tableagent/runs", json=run)
            fid = (await a.post("/v1/files", data={"purpose": "batch"},
                                files={"file": ("b.jsonl", _batch_file())})).json()["id"]
            bt = await a.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions"})
            assert r1.status_code == 201 and bt.status_code == 200, (r1.text, bt.text)
            # resubmitting the queued run is the same run, not another one: still allowed
            assert (await a.post("/v1/suites/tableagent/runs", json=run)).json()["id"] == r1.json()["id"]
            err = assert_openai_error(await a.post("/v1/suites/tableagent/runs", json={**run, "seed": 1}), 429,
                                      "job_quota_exceeded")
            assert err["param"] == "suites.tenant_max_queued_jobs" and "= 2" in err["message"]
            over = await a.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions"})
            assert_openai_error(over, 429, "job_quota_exceeded")
            assert len((await a.get("/v1/batches")).json()["data"]) == 1      # the refused batch was never made
            assert (await b.post("/v1/suites/tableagent/runs", json=run)).status_code == 201   # per tenant
            # finished work stops counting: cancelling the queued run frees its slot
            assert (await a.post(f"/v1/runs/{r1.json()['id']}/cancel")).json()["status"] == "cancelled"
            assert (await a.post("/v1/suites/tableagent/runs", json={**run, "seed": 1})).status_code == 201
    finally:
        await _drop_jobs_keys(app, redis_url, s)


# -- jobs run as the tenant that submitted them, through the guard ------------------------------------
OPERATOR_KEY = "op-secret-for-the-worker"


def _tenant_jobs_app(tmp_path: Path, redis_url: str, prefix: str, port: int) -> tuple[Any, Any, Any, ScriptedEngine]:
    """Auth on, an operator key (the worker's), tenant-a with a tighter response threshold than the
    deployment's, the scripted guard (cuts "world", flags "forbidden" prompts), the jobs API at ``port``."""
    import redis.asyncio as aioredis

    from offline_suites.config import SuiteSettings

    engine = ScriptedEngine()
    ops = OpsSettings(auth=AuthSettings(enabled=True, cache_ttl_s=0.0, admin_key=OPERATOR_KEY),
                      tenants={"tenant-a": TenantSettings(guard=GuardPolicyOverrides(response_threshold=0.3))})
    app, rt = make_app(engine, tmp_path, redis_url=redis_url, prefix=prefix, ops=ops,
                       guard=ScriptedGuard(trigger="world"), guard_policy=GuardPolicy())
    s = SuiteSettings(key_prefix=f"{prefix}:suites:", results_dir=tmp_path / "results",
                      api_base_url=f"http://127.0.0.1:{port}/v1", api_key=OPERATOR_KEY)
    app.state.suite_settings = s
    app.state.redis = aioredis.Redis.from_url(redis_url)
    return app, rt, s, engine


class _Served:
    """The app on a real port (the worker reaches it over HTTP, as in a deployment)."""

    def __init__(self, app: Any, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    async def __aenter__(self) -> None:
        self.task = asyncio.create_task(self.server.serve())
        for _ in range(200):
            if self.server.started:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("uvicorn did not start")

    async def __aexit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        await self.task


async def _burst_worker(s: Any, redis_url: str, **kw: Any) -> Any:
    from offline_suites.worker import build_worker

    w = build_worker(s, redis_url, burst=True, poll_delay=0.02, handle_signals=False, **kw)
    try:
        await w.main()
    finally:
        await w.close()
    return w


@pytest.mark.redis
async def test_only_the_operator_key_may_act_for_a_tenant(tmp_path: Path, redis_url: str, prefix: str) -> None:
    from offline_suites.config import TENANT_HEADER

    app, rt, s, engine = _tenant_jobs_app(tmp_path, redis_url, prefix, port=1)
    key_b, _ = await rt.keys.create("tenant-b")
    loose = chat(guard={"response_threshold": 0.4})     # under the deployment's 0.5, over tenant-a's 0.3
    try:
        async with client(app, key_b) as b, client(app, OPERATOR_KEY) as op:
            # a tenant naming another tenant: refused outright, nothing reaches the model
            err = assert_openai_error(await b.post("/v1/chat/completions", json=chat(), headers={TENANT_HEADER: "tenant-a"}),
                                      403, "tenant_header_not_allowed")
            assert err["param"] == TENANT_HEADER and engine.requests == []
            assert_openai_error(await op.post("/v1/chat/completions", json=chat(), headers={TENANT_HEADER: " "}), 400,
                                "invalid_tenant_header")
            # the operator acting for tenant-a gets tenant-a's policy, not its own
            assert (await op.post("/v1/chat/completions", json=loose)).status_code == 200
            r = await op.post("/v1/chat/completions", json=loose, headers={TENANT_HEADER: "tenant-a"})
            assert assert_openai_error(r, 400, "guard_override_not_allowed")["param"] == "guard.response_threshold"
            # and its ownership: the operator acting for tenant-b sees none of the operator's own jobs' privileges
            assert (await op.get("/v1/batches", headers={TENANT_HEADER: "tenant-b"})).json()["data"] == []
    finally:
        await _drop_jobs_keys(app, redis_url, s)


@pytest.mark.redis
async def test_batch_lines_run_as_the_submitting_tenant(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """Batch lines used to be sent with the worker's own key: the tenant's policy and audit attribution were
    replaced by the worker's."""
    from tests.conftest import free_port

    port = free_port()
    app, rt, s, engine = _tenant_jobs_app(tmp_path, redis_url, prefix, port)
    key_a, key_id_a = await rt.keys.create("tenant-a")
    lines = [{"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "scripted", "messages": [{"role": "user", "content": text}], **extra}}
             for cid, text, extra in [("plain", "hello", {}), ("flagged", "something forbidden", {}),
                                      ("loose", "hello", {"guard": {"response_threshold": 0.4}})]]
    payload = "".join(json.dumps(x) + "\n" for x in lines).encode()
    try:
        async with _Served(app, port), client(app, key_a) as a:
            f = (await a.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", payload)})).json()
            b = (await a.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions"})).json()
            await _burst_worker(s, redis_url)
            b = (await a.get(f"/v1/batches/{b['id']}")).json()
            assert b["status"] == "completed" and b["request_counts"] == {"total": 3, "completed": 1, "failed": 2}, b
            out = [json.loads(x) for x in (await a.get(f"/v1/files/{b['output_file_id']}/content")).text.splitlines()]
            err = {x["custom_id"]: x for x in (json.loads(y) for y in
                                                 (await a.get(f"/v1/files/{b['error_file_id']}/content")).text.splitlines())}
        # the response gate cut the plain line, the prompt gate refused the flagged one ...
        assert [o["custom_id"] for o in out] == ["plain"]
        assert out[0]["response"]["body"]["choices"][0]["finish_reason"] == "content_filter"
        assert "content_filter" in json.dumps(err["flagged"]["response"]["body"])
        # ... and tenant-a's ceiling (0.3) refused the override the worker's own policy (0.5) would take
        assert err["loose"]["response"]["body"]["error"]["code"] == "guard_override_not_allowed"
        assert len(engine.requests) == 1          # only the plain line reached the model
        lines_audit = [x for x in _audit_lines(rt) if x["route"] == "/v1/chat/completions"]
        assert lines_audit and {(x["tenant"], x["key_id"]) for x in lines_audit} == {("tenant-a", "admin")}
        assert key_id_a != "admin"
    finally:
        await _drop_jobs_keys(app, redis_url, s)


@pytest.mark.redis
async def test_suite_runs_reach_the_model_only_through_the_guard(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """A suite config puts client text into prompts (cgm's ``audit_professions``). The worker's in-process
    engine has no guard: a run submitted over the jobs API must not use it, but call the gateway as its
    submitter, so the prompt gate reads that text and the response gate the model's reply."""
    from tests.conftest import free_port

    door: list[str] = []

    def unguarded_engine() -> Any:        # the worker's own door to the model (the co-located engine)
        door.append("opened")
        raise AssertionError("a run from the jobs API reached the worker's unguarded engine")

    port = free_port()
    app, rt, s, engine = _tenant_jobs_app(tmp_path, redis_url, prefix, port)
    key_a, _ = await rt.keys.create("tenant-a")
    small = {"seq_len": 2, "vocab": 3, "hidden": 4, "lambdas": [1.0, 0.1], "reward_ns": [10, 20], "epochs": 2,
             "batch": 4, "estimator_replicates": 4, "estimator_batch": 2, "audit_samples": 1, "audit_max_tokens": 8, "lm_steps": 0,
             "audit_professions": ["doctor", "forbidden trade"]}
    try:
        async with _Served(app, port), client(app, key_a) as a:
            r = await a.post("/v1/suites/cgm/runs", json={"preset": "smoke", "config": small})
            assert r.status_code == 201, r.text
            await _burst_worker(s, redis_url, llm_factory=unguarded_engine)
            run = (await a.get(f"/v1/runs/{r.json()['id']}")).json()
        assert door == []
        # "doctor" went through (its reply cut by the response gate); the flagged profession was refused at
        # the prompt gate, which fails the run
        assert run["status"] == "failed" and "content_filter" in run["error"], run
        assert len(engine.requests) == 1
        audit = [x for x in _audit_lines(rt) if x["route"] == "/v1/chat/completions"]
        assert sorted(x["decision"] for x in audit) == ["intervened", "intervened"], audit
        assert {x["tenant"] for x in audit} == {"tenant-a"}
    finally:
        await _drop_jobs_keys(app, redis_url, s)


def test_compose_worker_reaches_the_gateway_as_the_operator() -> None:
    """In compose the worker had no base URL or key: every batch line failed."""
    import yaml

    c = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = c["services"]["worker"]["environment"]
    assert env["NEXTGUARD_SUITES__API_BASE_URL"] == "http://gateway:8000/v1"
    assert env["NEXTGUARD_SUITES__API_KEY"] == c["services"]["gateway"]["environment"]["NEXTGUARD_OPS__AUTH__ADMIN_KEY"]
    assert c["services"]["gateway"]["ports"][0].endswith(":8000")


# -- guard slots: bounded waits, shared fairly between tenants ------------------------------------------
def _slot_guard(tmp_path: Path, **settings: Any) -> Any:
    """The real NExT-Guard runtime over the guard tests' runner double, with one guard slot."""
    from tests.guard.conftest import make_guard, tiny_tokenizer

    guard, _, _ = make_guard(tiny_tokenizer(), tmp_path, max_batch=1, **settings)
    return guard


async def _until(cond: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)


def _guard_busy(gate: str) -> float:
    from gateway import metrics

    return float(metrics.GUARD_BUSY.labels(gate)._value.get())


async def test_a_flooding_tenant_cannot_starve_another(tmp_path: Path) -> None:
    """Guard slots used to go first come first served: a tenant that queued many requests made every other
    tenant wait behind all of them (and, with bounded waits, fail)."""
    from offline_suites.config import TENANT_HEADER
    from tests.gateway.test_serving import parse_sse

    guard = _slot_guard(tmp_path, prompt_gate=False, slot_wait_s=30)
    engine = ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), ops=OpsSettings(
        auth=AuthSettings(enabled=True, admin_key="op-secret-123")), guard=guard, guard_policy=GuardPolicy())

    def ask(c: Any, tenant: str) -> Any:
        body = chat(messages=[{"role": "user", "content": f"from {tenant}"}])
        return asyncio.create_task(c.post("/v1/chat/completions", json=body, headers={TENANT_HEADER: tenant}))

    try:
        async with client(app, "op-secret-123") as c:
            held = await guard.engine.acquire()           # the guard is busy ...
            flood = [ask(c, "tenant-a") for _ in range(5)]
            await _until(lambda: guard.engine.waiting == 5)   # ... and tenant-a queued five streams
            other = ask(c, "tenant-b")
            await _until(lambda: guard.engine.waiting == 6)
            await guard.engine.release(held)
            rs = await asyncio.wait_for(asyncio.gather(*flood, other), 30)
    finally:
        await guard.aclose()
    for r in rs:
        frames = parse_sse(r.text)
        assert r.status_code == 200 and frames[-1] == "[DONE]"
        assert "".join(f["choices"][0]["delta"].get("content") or "" for f in frames[:-1] if f["choices"]) == \
            "Hello, world!"
    # a stream reaches the engine once it holds its guard slot: the order the slots were handed out
    served = ["b" if "from tenant-b" in engine.tokenizer.decode(ids) else "a" for ids, _, _ in engine.requests]
    assert served == ["a", "b", "a", "a", "a", "a"]    # first come first served: a, a, a, a, a, b


async def test_one_tenant_has_no_cap_on_guard_waits(tmp_path: Path) -> None:
    """With auth off every request is tenant "default": fairness must not cap one tenant's waiting requests
    (twelve concurrent streams on one guard slot all complete)."""
    guard = _slot_guard(tmp_path, slot_wait_s=30)
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), guard=guard,
                      guard_policy=GuardPolicy())
    try:
        async with client(app) as c:
            rs = await asyncio.wait_for(
                asyncio.gather(*(c.post("/v1/chat/completions", json=chat()) for _ in range(12))), 60)
    finally:
        await guard.aclose()
    assert [r.status_code for r in rs] == [200] * 12
    assert all(r.text.endswith("data: [DONE]\n\n") and "guard_busy" not in r.text for r in rs)


@pytest.mark.parametrize("fail_closed", [True, False], ids=["fail_closed", "fail_open"])
async def test_response_gate_without_a_slot_in_time_fails_closed(tmp_path: Path, fail_closed: bool) -> None:
    """The response gate used to wait for a guard slot without bound. Now the wait is bounded, and when it
    runs out the choice ends before any text, under a fail-open policy too (else flooding the guard would be
    a way around it)."""
    from tests.gateway.test_serving import parse_sse

    guard = _slot_guard(tmp_path, prompt_gate=False, slot_wait_s=0.2)
    engine = ScriptedEngine()
    app, rt = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=guard,
                       guard_policy=GuardPolicy(fail_closed=fail_closed))
    busy0 = _guard_busy("response")
    try:
        async with client(app) as c:
            held = await guard.engine.acquire()
            r = await asyncio.wait_for(c.post("/v1/chat/completions", json=chat()), 10)
            r2 = await asyncio.wait_for(c.post("/v1/completions", json={"model": "scripted", "prompt": "hi"}), 10)
            await guard.engine.release(held)
    finally:
        await guard.aclose()
    assert r.status_code == 200
    frames = parse_sse(r.text)
    assert frames[-1] == "[DONE]"
    assert not any(f["choices"][0]["delta"].get("content") for f in frames[:-1] if f["choices"])
    ends = [f["choices"][0] for f in frames[:-1] if f["choices"] and f["choices"][0].get("finish_reason")]
    assert len(ends) == 1 and ends[0]["finish_reason"] == "content_filter"
    assert ends[0]["safety"]["decision"] == "guard_busy" and ends[0]["safety"]["gate"] == "response"
    choice = r2.json()["choices"][0]
    assert r2.status_code == 200 and choice["text"] == "" and choice["finish_reason"] == "content_filter"
    assert choice["safety"]["decision"] == "guard_busy"
    assert engine.requests == []                      # nothing was generated, so nothing unscored exists
    assert _guard_busy("response") == busy0 + 2
    decisions = [x["decision"] for x in (json.loads(y) for y in rt.audit.path.read_text().splitlines())]
    assert decisions == ["guard_busy", "guard_busy"]


async def test_prompt_gate_wait_for_a_guard_slot_is_bounded(tmp_path: Path) -> None:
    guard = _slot_guard(tmp_path, slot_wait_s=0.2)
    engine = ScriptedEngine()
    app, rt = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=guard, guard_policy=GuardPolicy())
    busy0 = _guard_busy("prompt")
    try:
        async with client(app) as c:
            held = await guard.engine.acquire()
            r = await asyncio.wait_for(c.post("/v1/chat/completions", json=chat()), 10)
            await guard.engine.release(held)
            again = await asyncio.wait_for(c.post("/v1/chat/completions", json=chat()), 10)
    finally:
        await guard.aclose()
    err = assert_openai_error(r, 503, "guard_busy")
    assert "retry" in err["message"] and int(r.headers["retry-after"]) >= 1
    assert _guard_busy("prompt") == busy0 + 1
    assert again.status_code == 200 and len(engine.requests) == 1     # only the retry reached the model
    assert guard.engine.waiting == 0 and rt.in_flight == 0


# -- a tenant's own jobs-API quotas, set by the operator --------------------------------------------------
@pytest.mark.redis
async def test_operator_sets_a_tenants_own_quotas(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """``nextguard keys quota`` gives one tenant other numbers than the ``suites.tenant_max_*`` settings;
    every other tenant keeps the settings', and ``default`` puts the tenant back on them."""
    app, rt, s = _jobs_app(tmp_path, redis_url, prefix, tenant_max_files=2, tenant_max_queued_jobs=2)
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    run = {"preset": "smoke", "config": {"llm_dialogues": 0, "dialogues": 2}}     # queued only: no worker here
    assert await _keys_cli(redis_url, prefix, "quota", "--tenant", "tenant-a", "--max-files", "3") == 0
    assert await _keys_cli(redis_url, prefix, "quota", "--tenant", "tenant-b", "--max-queued-jobs", "1") == 0
    assert await rt.quota_limits.list() == {"tenant-a": {"tenant_max_files": 3},
                                            "tenant-b": {"tenant_max_queued_jobs": 1}}
    with pytest.raises(SystemExit):          # 0 would refuse everything: not a quota, a mistake
        await _keys_cli(redis_url, prefix, "quota", "--tenant", "tenant-a", "--max-files", "0")
    assert await _keys_cli(redis_url, prefix, "quota", "--tenant", "no:such", "--max-files", "5") == 2
    try:
        async with client(app, key_a) as a, client(app, key_b) as b:
            async def up(c: Any) -> Any:
                return await c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", _batch_file())})

            assert [(await up(a)).status_code for _ in range(3)] == [200, 200, 200]     # over the setting's 2
            err = assert_openai_error(await up(a), 429, "file_count_quota_exceeded")
            assert err["param"] == "suites.tenant_max_files" and "tenant_max_files = 3 for this tenant" in err["message"]
            assert [(await up(b)).status_code for _ in range(3)] == [200, 200, 429]     # the setting's 2
            # tenant-b's own queue bound (1) is under the setting's (2); tenant-a keeps the setting's
            assert (await b.post("/v1/suites/tableagent/runs", json=run)).status_code == 201
            err = assert_openai_error(await b.post("/v1/suites/tableagent/runs", json={**run, "seed": 1}), 429,
                                      "job_quota_exceeded")
            assert "tenant_max_queued_jobs = 1 for this tenant" in err["message"]
            assert [(await a.post("/v1/suites/tableagent/runs", json={**run, "seed": i})).status_code
                    for i in range(3)] == [201, 201, 429]
            # back to the settings: tenant-a now holds one file more than it may keep
            assert await _keys_cli(redis_url, prefix, "quota", "--tenant", "tenant-a", "--max-files", "default") == 0
            assert await rt.quota_limits.get("tenant-a") == {}
            err = assert_openai_error(await up(a), 429, "file_count_quota_exceeded")
            assert "suites.tenant_max_files = 2" in err["message"]
    finally:
        await _drop_jobs_keys(app, redis_url, s)
