from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.streaming import json_response, sse_response
from gateway.deps import CompletionDep
from gateway.ops.middleware import admit_choices, may_disable_guard
from gateway.protocol import Completion, CompletionRequest, ErrorResponse

router = APIRouter(tags=["completions"])


@router.post(
    "/v1/completions",
    response_model=Completion,
    responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def create_completion(req: CompletionRequest, serving: CompletionDep, request: Request) -> Response:
    """Create a text completion; `echo` with `logprobs` (and `max_tokens=0`) scores the prompt."""
    st = request.state
    await admit_choices(request, serving.fan_out(req))
    allow_disable = await may_disable_guard(request, req.guard)
    prepared = await serving.prepare(req, getattr(st, "guard_policy", None), allow_disable)
    st.guard_policy_applied = prepared.policy     # what the audit line records
    if req.stream:
        return sse_response(serving.stream(prepared), prepared.stats, prepared.id)
    return json_response(await serving.complete(prepared), prepared.stats, prepared.id)
