"""API keys (hashed at rest), the auth matrix, tenant isolation, and the keys CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from fastapi import APIRouter

from gateway.auth import Authenticator, KeyStore, OwnersDep, OwnerStore, Principal, PrincipalDep, hash_key
from gateway.errors import OpenAIError
from gateway.ops_config import AuthSettings, OpsSettings
from tests.doubles import ScriptedEngine, ScriptedGuard
from tests.ops.conftest import assert_openai_error, chat, client, dead_redis_url, make_app

pytestmark = pytest.mark.redis


def auth_ops(**kw: Any) -> OpsSettings:
    return OpsSettings(auth=AuthSettings(enabled=True, cache_ttl_s=0.0, **kw))


async def test_keys_are_hashed_at_rest(redis_url: str, prefix: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    store = KeyStore(r, prefix)
    plain, rec = await store.create("acme", "ci")
    assert plain.startswith("ngk_") and len(plain) > 40
    assert rec.tenant == "acme" and rec.active
    dump = b""
    async for k in r.scan_iter(f"{prefix}:*"):
        dump += k
        if await r.type(k) == b"hash":
            for f, v in (await r.hgetall(k)).items():
                dump += f + v
    assert plain.encode() not in dump                  # the key itself is nowhere in Redis
    assert hash_key(plain).encode() in dump            # only its digest
    assert [x.id for x in await store.list()] == [rec.id]
    assert (await store.lookup(plain)) == rec
    revoked = await store.revoke(rec.id)
    assert not revoked.active and revoked.revoked_at is not None
    assert (await store.lookup(plain)).active is False  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="reserved"):
        await store.create("admin")
    await r.aclose()


async def test_auth_matrix(tmp_path: Path, redis_url: str, prefix: str) -> None:
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=redis_url, prefix=prefix, ops=auth_ops(),
                       guard=ScriptedGuard(trigger="never-said"))
    assert rt.keys is not None
    good, good_rec = await rt.keys.create("acme")
    revoked, rec = await rt.keys.create("acme")
    await rt.keys.revoke(rec.id)

    async with client(app) as c:
        assert_openai_error(await c.post("/v1/chat/completions", json=chat()), 401, "missing_api_key")
        r = await c.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Basic abc"})
        assert_openai_error(r, 401, "missing_api_key")
        r = await c.get("/v1/models")
        assert_openai_error(r, 401, "missing_api_key")
        assert r.headers["www-authenticate"] == "Bearer"
        # probes and the scrape stay open
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
    async with client(app, "ngk_not-a-key") as c:
        assert_openai_error(await c.post("/v1/chat/completions", json=chat()), 401, "invalid_api_key")
    async with client(app, revoked) as c:
        assert_openai_error(await c.post("/v1/chat/completions", json=chat()), 401, "revoked_api_key")
    async with client(app, good) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers={"X-Tenant": "other"})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert (await c.get("/v1/models")).status_code == 200

    # The audit line names the key's tenant, not what the client claimed.
    assert rt.audit is not None and rt.audit.path is not None
    lines = [json.loads(x) for x in rt.audit.path.read_text().splitlines()]
    assert [(x["tenant"], x["key_id"], x["decision"]) for x in lines] == [("acme", good_rec.id, "pass")]


async def test_revocation_takes_effect_after_cache_ttl(tmp_path: Path, redis_url: str, prefix: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    store = KeyStore(r, prefix)
    plain, rec = await store.create("acme")
    now = [0.0]
    auth = Authenticator(AuthSettings(enabled=True, cache_ttl_s=5.0), store, clock=lambda: now[0])
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"
    await store.revoke(rec.id)
    now[0] = 4.0
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"      # cached: the documented lag
    now[0] = 5.5
    with pytest.raises(OpenAIError) as e:
        await auth.authenticate(f"Bearer {plain}")
    assert e.value.status == 401 and e.value.code == "revoked_api_key"
    await r.aclose()


async def test_redis_down_keeps_known_keys(redis_url: str, prefix: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    store = KeyStore(r, prefix)
    plain, _ = await store.create("acme")
    now = [0.0]
    auth = Authenticator(AuthSettings(enabled=True, cache_ttl_s=1.0, stale_if_error_s=60.0), store, clock=lambda: now[0])
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"
    dead = aioredis.Redis.from_url(dead_redis_url(), socket_connect_timeout=0.2, socket_timeout=0.2)
    store.redis = dead
    now[0] = 30.0      # past the cache TTL: Redis is asked, fails, the recent answer stands
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"
    with pytest.raises(OpenAIError) as e:                       # a key never seen cannot be vouched for
        await auth.authenticate("Bearer ngk_unknown")
    assert e.value.status == 503 and e.value.headers.get("Retry-After")
    now[0] = 100.0     # past stale_if_error_s
    with pytest.raises(OpenAIError):
        await auth.authenticate(f"Bearer {plain}")
    await r.aclose()
    await dead.aclose()


async def test_admin_key_works_without_redis() -> None:
    auth = Authenticator(AuthSettings(enabled=True, admin_key="op-secret-123"), store=None)
    p = await auth.authenticate("Bearer op-secret-123")
    assert p.admin and p.tenant == "admin"
    with pytest.raises(OpenAIError) as e:
        await auth.authenticate("Bearer op-secret-124")
    assert e.value.status == 503      # no key store to ask: unavailable, not "wrong key"


async def test_other_tenants_job_is_refused(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """A resource claimed by tenant A answers 404 to tenant B (same as an unknown id), 200 to A and the operator."""
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=redis_url, prefix=prefix,
                       ops=auth_ops(admin_key="op-secret-123"))
    router = APIRouter()

    @router.post("/v1/test-runs")
    async def create_run(principal: PrincipalDep, owners: OwnersDep) -> dict[str, str]:
        await owners.claim("run", "run-1", principal)
        return {"id": "run-1"}

    @router.get("/v1/test-runs/{rid}")
    async def get_run(rid: str, principal: PrincipalDep, owners: OwnersDep) -> dict[str, str]:
        await owners.check("run", rid, principal)
        return {"id": rid, "tenant": principal.tenant}

    app.include_router(router)
    assert rt.keys is not None
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    async with client(app, key_a) as a, client(app, key_b) as b, client(app, "op-secret-123") as op:
        assert (await a.post("/v1/test-runs")).status_code == 200
        assert (await a.get("/v1/test-runs/run-1")).json() == {"id": "run-1", "tenant": "tenant-a"}
        err_b = assert_openai_error(await b.get("/v1/test-runs/run-1"), 404, "not_found")
        err_unknown = assert_openai_error(await a.get("/v1/test-runs/run-2"), 404, "not_found")
        assert err_b["message"].replace("run-1", "X") == err_unknown["message"].replace("run-2", "X")
        assert (await op.get("/v1/test-runs/run-1")).status_code == 200
        assert_openai_error(await b.get("/v1/test-runs/run-1", headers={"Authorization": ""}), 401)

    owners = OwnerStore(rt.redis, prefix)
    a_p, b_p = Principal("tenant-a", "key_a"), Principal("tenant-b", "key_b")
    assert await owners.visible("run", ["run-1", "run-2"], a_p) == ["run-1"]
    assert await owners.visible("run", ["run-1", "run-2"], b_p) == []
    # without auth there is one tenant and nothing to hide
    assert await owners.visible("run", ["run-1", "run-2"], Principal("default", None)) == ["run-1", "run-2"]


def test_keys_cli(redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from gateway.ops_cli import add_subcommands

    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> Any:
        args = parser.parse_args(["keys", "--redis-url", redis_url, "--prefix", prefix, "--json", *argv])
        rc = args.func(args)
        out = capsys.readouterr().out.strip().splitlines()[-1]
        return rc, json.loads(out) if out.startswith(("{", "[")) else out

    rc, created = run("create", "--tenant", "acme", "--name", "ci")
    assert rc == 0 and created["key"].startswith("ngk_") and created["tenant"] == "acme"
    rc, listed = run("list")
    assert rc == 0 and [k["id"] for k in listed] == [created["id"]] and "key" not in listed[0]
    rc, revoked = run("revoke", created["id"])
    assert rc == 0 and revoked["status"] == "revoked"
    args = parser.parse_args(["keys", "--redis-url", redis_url, "--prefix", prefix, "revoke", "key_nope"])
    assert args.func(args) == 1

    async def check() -> bool:
        r = aioredis.Redis.from_url(redis_url)
        rec = await KeyStore(r, prefix).lookup(created["key"])
        await r.aclose()
        return rec is not None and not rec.active

    assert asyncio.run(check())
