"""``POST /v1/moderations`` (OpenAI shape) and the guard's own ``/v1/guard/*`` endpoints."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import OpenAIError, not_ready
from gateway.protocol import (
    ErrorResponse,
    GuardScoreRequest,
    GuardScoreResponse,
    ModerationRequest,
    ModerationResponse,
    ModerationResult,
)
from gateway.serving.common import new_id
from guard.api import GuardBusy, GuardInputError

router = APIRouter(tags=["guard"])


def _guard(request: Request) -> Any:
    st = request.app.state
    guard = st.guard
    if guard is None:
        if st.guard_required:
            raise not_ready("The safety guard is still loading; retry shortly.")
        raise OpenAIError(404, "The safety guard is disabled on this deployment.", code="guard_disabled")
    if not guard.ready:
        raise not_ready("The safety guard is still loading; retry shortly.")
    return guard


async def _call(coro: Any) -> Any:
    try:
        return await coro
    except GuardInputError as e:     # longer than the guard's context, or not valid Unicode
        raise OpenAIError(400, str(e), param=e.param, code="invalid_guard_input") from e
    except ValueError as e:          # e.g. text longer than the guard's context: the caller's to fix
        raise OpenAIError(400, str(e), code="invalid_value") from e
    except GuardBusy as e:
        raise OpenAIError(503, "The safety guard is busy; retry shortly.", code="guard_busy",
                          headers={"Retry-After": "1"}) from e
    except Exception as e:
        raise OpenAIError(500, f"The guard failed to score the input: {type(e).__name__}", code="guard_error") from e


@router.post("/v1/moderations", response_model=ModerationResponse, responses={400: {"model": ErrorResponse}})
async def create_moderation(req: ModerationRequest, request: Request) -> ModerationResponse:
    """Classify texts with the NExT-Guard prompt gate (OpenAI moderation shape)."""
    guard = _guard(request)
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    results = await _call(guard.moderate(texts))
    return ModerationResponse(
        id=new_id("modr"), model=req.model or guard.name, results=[ModerationResult(**r) for r in results]
    )


@router.post("/v1/guard/score", response_model=GuardScoreResponse, responses={400: {"model": ErrorResponse}})
async def guard_score(req: GuardScoreRequest, request: Request) -> GuardScoreResponse:
    """Per-token risk over the response (or over the prompt when no response is given), with the cut point."""
    guard = _guard(request)
    conv = req.prompt if req.messages is None else tuple((m.role, m.text()) for m in req.messages)
    return GuardScoreResponse(**(await _call(guard.score_text(conv, req.response))))


@router.get("/v1/guard/features")
async def guard_features(request: Request) -> dict[str, Any]:
    """The selected SAE features per gate and category, with weights and auto-labels where the build made them."""
    guard = _guard(request)
    describe = getattr(guard, "describe_features", None)
    if describe is None:
        raise OpenAIError(404, f"The guard '{guard.name}' does not publish its features.", code="not_supported")
    return {"object": "list", "guard": guard.name, "features": describe()}
