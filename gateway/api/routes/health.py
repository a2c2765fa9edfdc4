from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import metrics

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


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
    body = {"status": "ready" if ok else "not_ready", "checks": checks}
    if state.engine_error:
        body["error"] = state.engine_error
    return JSONResponse(body, status_code=200 if ok else 503, headers={} if ok else {"Retry-After": "5"})


@router.get("/metrics")
async def prometheus_metrics() -> Response:
    """Prometheus exposition: `gateway_*` and the engine's `vllm:*` metrics."""
    data, ctype = metrics.render()
    return Response(data, media_type=ctype)
