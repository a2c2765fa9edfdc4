from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.streaming import json_response, sse_response
from gateway.deps import ChatDep
from gateway.ops.middleware import admit_choices, may_disable_guard
from gateway.protocol import ChatCompletion, ChatCompletionRequest, ErrorResponse

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def create_chat_completion(req: ChatCompletionRequest, serving: ChatDep, request: Request) -> Response:
    """Create a chat completion (streamed as SSE when `stream` is true), guarded token by token."""
    st = request.state
    await admit_choices(request, serving.fan_out(req))
    allow_disable = await may_disable_guard(request, req.guard)
    prepared = await serving.prepare(req, getattr(st, "guard_policy", None), allow_disable)
    st.guard_policy_applied = prepared.policy     # what the audit line records
    if req.stream:
        return sse_response(serving.stream(prepared), prepared.stats, prepared.id)
    return json_response(await serving.complete(prepared), prepared.stats, prepared.id)
