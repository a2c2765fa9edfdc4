"""Exceptions at the service edge, rendered as the OpenAI error shape
``{"error": {"message", "type", "param", "code"}}`` with the matching HTTP status."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from guard.api import GuardInputError

log = logging.getLogger(__name__)

_STATUS_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",   # what OpenAI returns for an unknown model
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class OpenAIError(Exception):
    """An error that becomes an OpenAI-shaped response (or an in-stream error frame)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _STATUS_TYPE.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        err.update(self.extra)
        return {"error": err}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(404, message, param=param, code=code)


def not_ready(message: str = "The model is still loading; retry shortly.") -> OpenAIError:
    return OpenAIError(503, message, code="model_not_ready", headers={"Retry-After": "5"})


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    # pydantic puts the union member / validator name in the path; keep the field path readable.
    parts = [p for p in parts if not p.startswith(("function-", "list[", "str", "int", "union["))]
    return ".".join(parts) or None


def _validation_error(exc: RequestValidationError) -> OpenAIError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    msg = str(first.get("msg", "Invalid request"))
    if first.get("type") == "json_invalid":
        return bad_request("We could not parse the JSON body of your request. Send valid JSON.", code="invalid_json")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    param = _loc_to_param(loc)
    if first.get("type") == "extra_forbidden" and param:
        msg = f"Unknown field '{param}'"
        known = _known_fields(exc, loc)
        if known:
            import difflib

            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg += (f"; did you mean '{close[0]}'?" if close else "") + f" Known: {', '.join(known)}"
    text = f"{msg} (param: {param})" if param else msg
    if len(errors) > 1:
        text += f" and {len(errors) - 1} more error(s)"
    return bad_request(text, param=param, code="invalid_value" if param else None)


def _known_fields(exc: RequestValidationError, loc: tuple[Any, ...]) -> list[str]:
    """The fields of the model that refused an unknown one (only the guard overrides forbid extras)."""
    from gateway.protocol import GuardOverrides

    return sorted(GuardOverrides.model_fields) if "guard" in loc else []


QUEUE_RETRY_AFTER_S = 5


def _queue_name(request: Request) -> str:
    from offline_suites.config import SuiteSettings
    from offline_suites.keys import Keys

    st = request.app.state
    s = getattr(st, "suite_settings", None) or getattr(getattr(st, "settings", None), "suites", None)
    return Keys((s if isinstance(s, SuiteSettings) else SuiteSettings()).key_prefix).queue


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = _validation_error(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"Unknown route {request.method} {request.url.path}"
        err = OpenAIError(exc.status_code, detail)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=dict(exc.headers or {}))

    @app.exception_handler(RedisError)
    async def _redis_down(request: Request, exc: RedisError) -> JSONResponse:
        # Only the jobs API (runs, batches, files) needs Redis to answer; streaming degrades to local limits.
        queue = _queue_name(request)
        log.warning("%s %s -> 503: Redis (job queue %s) unavailable: %s", request.method, request.url.path, queue,
                    type(exc).__name__)
        err = OpenAIError(
            503, f"The job queue '{queue}' (Redis) is unreachable; retry shortly.", code="queue_unavailable",
            headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)},
        )
        return JSONResponse(err.body(), status_code=503, headers=err.headers)

    @app.exception_handler(GuardInputError)
    async def _guard_input(request: Request, exc: GuardInputError) -> JSONResponse:
        err = bad_request(str(exc), param=exc.param, code="invalid_guard_input")
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(UnicodeError)
    async def _bad_unicode(request: Request, exc: UnicodeError) -> JSONResponse:
        # JSON may carry a lone surrogate ("\ud800"), which no tokenizer can read: the caller's input
        start = getattr(exc, "start", None)
        where = f" at character {start}" if start is not None else ""
        err = bad_request(f"The request holds text that is not valid Unicode (a lone surrogate{where}).",
                          code="invalid_unicode")
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        err = OpenAIError(500, "The server had an error while processing your request.")
        return JSONResponse(err.body(), status_code=500)
