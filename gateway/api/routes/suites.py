"""Offline evaluation suites and their runs (``/v1/suites``, ``/v1/runs``). Thin: logic lives in
``offline_suites.jobs``; runs execute on ``nextguard worker`` processes through Redis.

A run belongs to the tenant that submitted it (its id is scoped to the submitter; ``gateway.ops.auth.OwnerStore``,
kind ``run``); to every other tenant it answers exactly like an unknown id, and listings show only the
caller's runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

from gateway.errors import OpenAIError
from gateway.ops.auth import OwnersDep, PrincipalDep
from offline_suites.base import ConfigError
from offline_suites.config import SuiteSettings
from offline_suites.jobs import (
    IdempotencyConflict,
    RunNotFound,
    RunStore,
    cancel_run,
    public_view,
    submission_run_id,
    submit_run,
)
from offline_suites.keys import Keys
from offline_suites.quotas import QuotaExceeded, TenantQuotas
from offline_suites.registry import UnknownSuiteError, get_suite, list_suites

router = APIRouter()
REDIS_TIMEOUT_S = 2.0


class RunRequest(BaseModel):
    preset: str = Field("smoke", description="'smoke' (≤ 60 s on 2 cores) or 'full'")
    config: dict[str, Any] = Field(default_factory=dict, description="overrides of the preset's fields")
    seed: int = 0


def suite_settings(request: Request) -> SuiteSettings:
    st = request.app.state
    cached = getattr(st, "suite_settings", None)
    if cached is None:
        cached = getattr(getattr(st, "settings", None), "suites", None) or SuiteSettings()
        st.suite_settings = cached
    return cached  # type: ignore[no-any-return]


def redis_client(request: Request) -> Any:
    """The app's redis.asyncio client; created lazily from ``settings.redis.url`` if the app has none."""
    st = request.app.state
    client = getattr(st, "redis", None)
    if client is None:
        import redis.asyncio as aioredis

        url = st.settings.redis.url if getattr(st, "settings", None) is not None else "redis://127.0.0.1:6379/0"
        # Bounded: with Redis away the jobs API must answer 503 at once, not hang on the socket.
        client = aioredis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
        st.redis = client
    return client


async def _store(request: Request) -> RunStore:
    s = suite_settings(request)
    return RunStore(redis_client(request), Keys(s.key_prefix), s.keep_runs_s, s.results_dir)


def quotas(request: Request) -> TenantQuotas:
    """The jobs API's quotas, with the tenants' own numbers where the operator set them."""
    rt = getattr(request.app.state, "ops", None)
    own = rt.quota_limits if rt is not None else None
    return TenantQuotas(redis_client(request), suite_settings(request), limits=own.get if own is not None else None)


def quota_error(e: QuotaExceeded) -> OpenAIError:
    return OpenAIError(429, str(e), param=e.limit, code=e.code)


def _not_found(run_id: str) -> OpenAIError:
    return OpenAIError(404, f"No run with id {run_id!r}.", param="run_id", code="run_not_found")


@router.get("/v1/suites")
async def suites_list() -> dict[str, Any]:
    """Registered suites: name, version, presets, description."""
    return {"object": "list", "data": [{"object": "suite", **s.info()} for s in list_suites()]}


@router.post("/v1/suites/{name}/runs")
async def runs_create(name: str, body: RunRequest, request: Request, principal: PrincipalDep,
                      owners: OwnersDep,
                      idempotency_key: str | None = Header(default=None, max_length=255)) -> JSONResponse:
    """Queue a run; returns the run object. The run is the caller's alone: submitting it again returns it
    (idempotent on suite, version, config and seed, or on the `Idempotency-Key` header when sent), and
    another tenant's identical submission is a run of its own."""
    reserved: str | None = None
    try:
        get_suite(name)
        run_id = submission_run_id(name, body.preset, body.config, body.seed, owner=principal.tenant,
                                   idempotency_key=idempotency_key)
        if await quotas(request).reserve_job(principal.tenant, "run", run_id):
            reserved = run_id
        rec, created = await submit_run(redis_client(request), suite_settings(request), name, body.preset,
                                        body.config, body.seed, owner=principal.tenant,
                                        idempotency_key=idempotency_key)
        reserved = None
    except QuotaExceeded as e:
        raise quota_error(e) from e
    except UnknownSuiteError as e:
        raise OpenAIError(404, str(e), param="name", code="suite_not_found") from e
    except IdempotencyConflict as e:
        raise OpenAIError(409, str(e), param="Idempotency-Key", code="idempotency_key_reused") from e
    except ConfigError as e:
        raise OpenAIError(400, str(e), param="config", code="invalid_config") from e
    finally:
        if reserved is not None:    # refused after the reservation: it counts nothing
            await quotas(request).release_job(principal.tenant, "run", reserved)
    await owners.claim("run", rec["id"], principal)
    return JSONResponse(public_view(rec), status_code=201 if created else 200)


@router.get("/v1/runs")
async def runs_list(request: Request, principal: PrincipalDep, owners: OwnersDep,
                    limit: int = Query(20, ge=1, le=100), after: str | None = None) -> dict[str, Any]:
    """The caller's recent runs, newest first (without result bodies)."""
    store = await _store(request)
    recs = await owners.page("run", principal, store.list, limit + 1, after)
    data = [public_view(r, include_result=False) for r in recs[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(recs) > limit}


@router.get("/v1/runs/{run_id}")
async def runs_get(run_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """Status, progress and (when finished) the SuiteResult of one run."""
    await owners.check("run", run_id, principal, _not_found(run_id))
    rec = await (await _store(request)).get(run_id)
    if rec is None:
        raise _not_found(run_id)
    return public_view(rec)


@router.get("/v1/runs/{run_id}/artifacts/{filename}")
async def runs_artifact(run_id: str, filename: str, request: Request, principal: PrincipalDep,
                        owners: OwnersDep) -> FileResponse:
    """One stored artifact (PNG/JSON) of a run."""
    await owners.check("run", run_id, principal, _not_found(run_id))
    rec = await (await _store(request)).get(run_id)
    if rec is None:
        raise _not_found(run_id)
    # only names the run itself recorded: no path traversal, no listing of the results dir
    if filename not in rec.get("artifacts", []):
        raise OpenAIError(404, f"Run {run_id} has no artifact {filename!r}. Available: {', '.join(rec.get('artifacts', []))}",
                          param="filename", code="artifact_not_found")
    path = suite_settings(request).results_dir / run_id / filename
    if not path.is_file():
        raise OpenAIError(404, f"Artifact {filename!r} is recorded but missing on disk", code="artifact_missing")
    return FileResponse(path)


@router.post("/v1/runs/{run_id}/cancel")
async def runs_cancel(run_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """Cancel a queued or running run (a running suite stops at its next progress report)."""
    await owners.check("run", run_id, principal, _not_found(run_id))
    try:
        rec = await cancel_run(redis_client(request), suite_settings(request), run_id)
    except RunNotFound as e:
        raise _not_found(run_id) from e
    return public_view(rec)
