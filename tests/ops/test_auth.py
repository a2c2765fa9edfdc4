"""API keys (hashed at rest), the auth matrix, tenant isolation, and the keys CLI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.errors import OpenAIError
from gateway.ops.auth import UNKNOWN_KEYS_CACHED, Authenticator, KeyStore, OwnerStore, Principal, hash_key
from gateway.ops.config import AuthSettings, OpsSettings
from offline_suites import batch as B
from offline_suites.config import SuiteSettings
from offline_suites.keys import Keys
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


class _CountingStore(KeyStore):
    def __init__(self, redis: Any, prefix: str) -> None:
        super().__init__(redis, prefix)
        self.asked: list[str] = []

    async def lookup(self, plain: str) -> Any:
        self.asked.append(plain)
        return await super().lookup(plain)


async def test_random_keys_cannot_flush_a_known_key_from_the_cache(redis_url: str, prefix: str) -> None:
    """A flood of made-up keys used to fill the one lookup cache until it was cleared, so every real key
    went back to Redis (and lost its stale-if-error cover). Unknown keys now have a bounded cache of their own."""
    r = aioredis.Redis.from_url(redis_url)
    store = _CountingStore(r, prefix)
    plain, _ = await store.create("acme")
    now = [0.0]
    auth = Authenticator(AuthSettings(enabled=True, cache_ttl_s=5.0, stale_if_error_s=60.0), store,
                         clock=lambda: now[0])
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"
    assert store.asked == [plain]

    async def refused(key: str) -> None:
        with pytest.raises(OpenAIError) as e:
            await auth.authenticate(f"Bearer {key}")
        assert e.value.status == 401

    flood = [f"ngk_random-{i}" for i in range(UNKNOWN_KEYS_CACHED + 10_050)]
    for i in range(0, len(flood), 500):
        await asyncio.gather(*(refused(k) for k in flood[i:i + 500]))
    store.asked.clear()
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"
    assert store.asked == []                                    # still served from the cache
    await refused(flood[-1])
    assert store.asked == []                                    # a recent bad key is not asked again either...
    await refused(flood[0])
    assert store.asked == [flood[0]]                            # ...but the unknown-key cache stays bounded

    # and the known key keeps its stale-if-error cover through an outage after the flood
    dead = aioredis.Redis.from_url(dead_redis_url(), socket_connect_timeout=0.2, socket_timeout=0.2)
    store.redis = dead
    now[0] = 30.0
    assert (await auth.authenticate(f"Bearer {plain}")).tenant == "acme"
    await r.aclose()
    await dead.aclose()


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


ADMIN_KEY = "op-secret-123"
RUN = {"preset": "smoke", "config": {"llm_dialogues": 0, "dialogues": 2}}     # queued only: no worker runs it
BATCH_LINE = json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}})


@pytest.fixture
async def jobs_app(tmp_path: Path, redis_url: str, prefix: str) -> AsyncIterator[tuple[Any, Any, SuiteSettings]]:
    """The real app with auth on and the real suite/batch routes; run, file and batch records under the
    test's own prefix (removed afterwards with the ops keys)."""
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=redis_url, prefix=prefix,
                       ops=auth_ops(admin_key=ADMIN_KEY))
    s = SuiteSettings(key_prefix=f"{prefix}:suites:", results_dir=tmp_path / "results")
    app.state.suite_settings = s
    app.state.redis = aioredis.Redis.from_url(redis_url)
    yield app, rt, s
    await app.state.redis.aclose()
    import redis

    r = redis.Redis.from_url(redis_url)
    for pat in Keys(s.key_prefix).patterns():
        keys = list(r.scan_iter(match=pat, count=1000))
        if keys:
            r.delete(*keys)
    r.close()


def _same_404(got: httpx.Response, unknown: httpx.Response, rid: str, unknown_id: str, code: str) -> None:
    """Another tenant's id reads exactly like an id that does not exist."""
    err = assert_openai_error(got, 404, code)
    err_unknown = assert_openai_error(unknown, 404, code)
    assert err["message"].replace(rid, "X") == err_unknown["message"].replace(unknown_id, "X")
    assert err["param"] == err_unknown["param"]


async def test_other_tenants_jobs_are_refused(jobs_app: tuple[Any, Any, SuiteSettings]) -> None:
    """Tenant A's run, file and batch answer 404 to tenant B on every route (as an unknown id would) and are
    missing from B's listings; A and the operator key see them."""
    app, rt, s = jobs_app
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    async with client(app, key_a) as a, client(app, key_b) as b, client(app, ADMIN_KEY) as op:
        r = await a.post("/v1/suites/tableagent/runs", json=RUN)
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
        r = await a.post("/v1/files", files={"file": ("in.jsonl", BATCH_LINE.encode())}, data={"purpose": "batch"})
        assert r.status_code == 200, r.text
        file_id = r.json()["id"]
        r = await a.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"})
        assert r.status_code == 200, r.text
        batch_id = r.json()["id"]
        b_run = (await b.post("/v1/suites/tableagent/runs", json={**RUN, "seed": 7})).json()["id"]

        # the owner
        assert (await a.get(f"/v1/runs/{run_id}")).json()["status"] == "queued"
        assert_openai_error(await a.get(f"/v1/runs/{run_id}/artifacts/x.png"), 404, "artifact_not_found")  # past the owner check
        assert [x["id"] for x in (await a.get("/v1/runs")).json()["data"]] == [run_id]
        assert (await a.get(f"/v1/files/{file_id}")).status_code == 200
        assert (await a.get(f"/v1/files/{file_id}/content")).content.strip() == BATCH_LINE.encode()
        assert (await a.get(f"/v1/batches/{batch_id}")).json()["id"] == batch_id
        assert [x["id"] for x in (await a.get("/v1/batches")).json()["data"]] == [batch_id]

        # another tenant with a valid key: every route answers as for an id that does not exist
        for method, path, unknown, rid, code in [
            ("GET", f"/v1/runs/{run_id}", "/v1/runs/run-nope", run_id, "run_not_found"),
            ("GET", f"/v1/runs/{run_id}/artifacts/x.png", "/v1/runs/run-nope/artifacts/x.png", run_id, "run_not_found"),
            ("POST", f"/v1/runs/{run_id}/cancel", "/v1/runs/run-nope/cancel", run_id, "run_not_found"),
            ("GET", f"/v1/files/{file_id}", "/v1/files/run-nope", file_id, "file_not_found"),
            ("GET", f"/v1/files/{file_id}/content", "/v1/files/run-nope/content", file_id, "file_not_found"),
            ("GET", f"/v1/batches/{batch_id}", "/v1/batches/run-nope", batch_id, "batch_not_found"),
            ("POST", f"/v1/batches/{batch_id}/cancel", "/v1/batches/run-nope/cancel", batch_id, "batch_not_found"),
        ]:
            _same_404(await b.request(method, path), await b.request(method, unknown), rid, "run-nope", code)
        r = await b.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"})
        assert_openai_error(r, 404, "file_not_found")               # cannot batch over A's upload either
        assert [x["id"] for x in (await b.get("/v1/runs")).json()["data"]] == [b_run]
        assert (await b.get("/v1/batches")).json()["data"] == []
        # B's cancel did nothing to A's run or batch
        assert (await a.get(f"/v1/runs/{run_id}")).json()["cancel_requested"] is False
        assert (await a.get(f"/v1/batches/{batch_id}")).json()["status"] == "validating"

        # the operator key sees every tenant's jobs
        assert (await op.get(f"/v1/runs/{run_id}")).status_code == 200
        assert {x["id"] for x in (await op.get("/v1/runs")).json()["data"]} == {run_id, b_run}
        assert (await op.get(f"/v1/files/{file_id}")).status_code == 200
        assert (await op.get(f"/v1/batches/{batch_id}")).status_code == 200

        # a batch's output file (written by a worker, which knows no tenant) is readable by the batch's owner
        redis = app.state.redis
        out = await B.store_file(redis, s, b'{"custom_id": "c1"}\n', f"{batch_id}_output.jsonl", "batch_output")
        rec = await B.get_batch(redis, s, batch_id)
        assert rec is not None
        await redis.set(Keys(s.key_prefix).batch(batch_id), json.dumps({**rec, "output_file_id": out["id"]}))
        assert (await a.get(f"/v1/batches/{batch_id}")).json()["output_file_id"] == out["id"]
        assert (await a.get(f"/v1/files/{out['id']}/content")).status_code == 200
        assert_openai_error(await b.get(f"/v1/files/{out['id']}/content"), 404, "file_not_found")

        # the owner can cancel
        r = await a.post(f"/v1/runs/{run_id}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"

    # the owner sets behind the routes
    owners = OwnerStore(rt.redis, rt.settings.redis.key_prefix)
    a_p, b_p = Principal("tenant-a", "key_a"), Principal("tenant-b", "key_b")
    assert await owners.visible("run", [run_id, b_run], a_p) == [run_id]
    assert await owners.visible("run", [run_id, b_run], b_p) == [b_run]
    # without auth there is one tenant and nothing to hide (and nothing is recorded for it)
    assert await owners.visible("run", [run_id, "run-2"], Principal("default", None)) == [run_id, "run-2"]


async def test_job_routes_refuse_missing_bad_and_revoked_keys(jobs_app: tuple[Any, Any, SuiteSettings]) -> None:
    app, rt, _ = jobs_app
    revoked, rec = await rt.keys.create("tenant-a")
    await rt.keys.revoke(rec.id)
    routes = [("POST", "/v1/suites/tableagent/runs"), ("GET", "/v1/runs"), ("GET", "/v1/runs/r1"),
              ("GET", "/v1/runs/r1/artifacts/a.png"), ("POST", "/v1/runs/r1/cancel"), ("POST", "/v1/files"),
              ("GET", "/v1/files/f1"), ("GET", "/v1/files/f1/content"), ("POST", "/v1/batches"),
              ("GET", "/v1/batches"), ("GET", "/v1/batches/b1"), ("POST", "/v1/batches/b1/cancel")]
    for key, code in ((None, "missing_api_key"), ("ngk_not-a-key", "invalid_api_key"), (revoked, "revoked_api_key")):
        async with client(app, key) as c:
            for method, path in routes:
                assert_openai_error(await c.request(method, path, json=RUN if method == "POST" else None), 401, code)


async def test_runs_listing_pages_over_visible_runs_only(jobs_app: tuple[Any, Any, SuiteSettings]) -> None:
    """Other tenants' runs in between must neither show up nor cut pages short."""
    app, rt, _ = jobs_app
    key_a, _ = await rt.keys.create("tenant-a")
    key_b, _ = await rt.keys.create("tenant-b")
    mine = []
    async with client(app, key_a) as a, client(app, key_b) as b:
        for seed in range(3):
            mine.append((await a.post("/v1/suites/tableagent/runs", json={**RUN, "seed": seed})).json()["id"])
            for k in range(2):
                assert (await b.post("/v1/suites/tableagent/runs", json={**RUN, "seed": 100 + 10 * seed + k})).status_code == 201
        newest_first = mine[::-1]
        p1 = (await a.get("/v1/runs", params={"limit": 2})).json()
        assert [x["id"] for x in p1["data"]] == newest_first[:2] and p1["has_more"] is True
        p2 = (await a.get("/v1/runs", params={"limit": 2, "after": p1["last_id"]})).json()
        assert [x["id"] for x in p2["data"]] == newest_first[2:] and p2["has_more"] is False


def test_keys_cli(redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from gateway.ops.cli import add_subcommands

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
