from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import metrics

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Liveness: the process answers and its engine is alive. A dead engine (or one that failed to load)
    never comes back by itself, so this fails and the supervisor restarts the process."""
    state = request.app.state
    engine = state.engine
    if state.engine_error or (engine is not None and not engine.ready):
        return JSONResponse({"status": "dead", "checks": {"engine": False}}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Readiness: the engine is loaded (and the guard, when enabled)."""
    state = request.app.state
    engine = state.engine
    checks = {
        "engine": engine is not None and engine.ready,
        "guard": (state.guard is not None and bool(state.guard.ready)) if state.guard_required else True,
        "accepting": not state.draining,
    }
    if state.engine_error:
        checks["engine"] = False
    ok = all(checks.values())
    body: dict[str, object] = {"status": "ready" if ok else "not_ready", "checks": checks}
    if state.engine_error:
        # the cause is in the server log; an exception's text can carry paths, hosts or tokens
        body["error"] = "the engine or the guard failed to load; see the server log"
    return JSONResponse(body, status_code=200 if ok else 503, headers={} if ok else {"Retry-After": "5"})


@router.get("/metrics")
async def prometheus_metrics() -> Response:
    """Prometheus exposition: `gateway_*` and the engine's `vllm:*` metrics."""
    data, ctype = metrics.render()
    return Response(data, media_type=ctype)
