"""The ops layer's one pure-ASGI middleware (outermost, so it sees every request, streamed or not), added
by :func:`gateway.ops.lifecycle.install_ops`. In order, it:

1. refuses new work with 503 once a drain started (SIGTERM), while open streams finish;
2. reads the body with a hard size cap (also for chunked uploads, which carry no Content-Length) -> 413;
3. authenticates the API key and sets ``request.state.principal`` / ``.tenant`` / ``.guard_policy``
   (the tenant's resolved ``guard.api.GuardPolicy``) / ``.allow_guard_disable``;
4. takes an admission slot for generation routes (429 quota vs 503 overload, ``Retry-After``), and lets
   the route take one more per further choice (:func:`admit_choices`);
5. sets the request's stream timeouts (``gateway.serving.common.STREAM_TIMEOUTS``), its tenant as the guard's
   client (``guard.api.GUARD_CLIENT``: guard slots are shared fairly between tenants) and a stats sink;
6. after the response is done: releases the slots and writes the audit lines of the guard decisions
   (:mod:`gateway.ops.request_audit`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from gateway import metrics, sse
from gateway.errors import OpenAIError
from gateway.ops.admission import AdmissionController, Rejected, Slot
from gateway.ops.auth import Principal
from gateway.ops.request_audit import audit_request
from gateway.ops.tenants import GUARD_DISABLE
from gateway.serving.common import STREAM_TIMEOUTS, StreamStats, StreamTimeouts
from guard.api import GUARD_CLIENT
from offline_suites.config import TENANT_HEADER

if TYPE_CHECKING:
    from gateway.ops.lifecycle import IPNetwork, OpsRuntime

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_CAPTURE_CAP = 1 << 20          # response bytes kept for the audit log (content mode / prompt refusals)


async def _release_all(admission: AdmissionController, slots: list[Slot]) -> None:
    for s in list(slots):
        await admission.release(s)


async def admit_choices(request: Any, choices: int) -> None:
    """Count every choice of a request by admission: the middleware took one slot for the request, this
    takes one more per further choice (each is its own engine request and guard stream). Over the tenant's
    in-flight quota it answers 400; a full deployment or tenant, 503/429 as for any request."""
    admit_more = getattr(request.state, "admit_more", None)
    if admit_more is not None and choices > 1:
        await admit_more(choices - 1)


async def may_disable_guard(request: Any, overrides: Any | None) -> bool | None:
    """Whether this request may switch the guard off (``guard.enabled=false``): the settings' permission for
    its tenant, else a grant from ``nextguard keys grant``. Redis is asked only when the request wants the
    guard off. ``None`` (no ops layer) leaves the decision to the serving defaults."""
    allowed: bool | None = getattr(request.state, "allow_guard_disable", None)
    if overrides is None or overrides.enabled is not False or allowed:
        return allowed
    rt = getattr(request.app.state, "ops", None)
    if rt is None or rt.grants is None:
        return allowed
    return await rt.grants.has(request.state.tenant, GUARD_DISABLE)


def _error_response(err: OpenAIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _route_label(path: str) -> str:
    return {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(path, "other")


class OpsMiddleware:
    def __init__(self, app: ASGIApp, runtime: OpsRuntime) -> None:
        self.app = app
        self.rt = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rt = self.rt
        path: str = scope["path"]
        method: str = scope["method"]
        public = any(path == p or (p.endswith("/") and path.startswith(p)) for p in rt.ops.auth.public_paths)
        loop = asyncio.get_running_loop()
        arrived = loop.time()

        if path == "/metrics" and not _metrics_client_allowed(scope, rt.metrics_networks):
            # as if the route did not exist: the scrape is for the internal network only
            await _error_response(OpenAIError(404, f"Unknown route {method} {path}"))(scope, receive, send)
            return

        bad_header = _unknown_operator_header(scope)
        if bad_header is not None:
            metrics.REQUESTS.labels(_route_label(path), "400").inc()
            await _error_response(bad_header)(scope, receive, send)
            return

        if rt.draining and not public:
            metrics.SHED.labels("503", "draining").inc()
            await _error_response(
                OpenAIError(503, "The server is shutting down; retry on another replica.", code="server_shutting_down",
                            headers={"Retry-After": "1", "Connection": "close"})
            )(scope, receive, send)
            return

        # -- who is calling ----------------------------------------------------------------------
        principal = Principal(tenant=rt.ops.default_tenant, key_id=None)
        if rt.auth is not None and not public:
            headers = dict(scope.get("headers") or [])
            auth_header = headers.get(b"authorization")
            try:
                principal = await rt.auth.authenticate(auth_header.decode("latin-1") if auth_header else None)
                principal = _acting_for(principal, headers.get(TENANT_HEADER.lower().encode()))
            except OpenAIError as e:
                metrics.REQUESTS.labels(_route_label(path), str(e.status)).inc()
                await _error_response(e)(scope, receive, send)
                return
        view = rt.tenants.view(principal.tenant)
        state = scope.setdefault("state", {})
        state["principal"] = principal
        state["tenant"] = principal.tenant
        state["guard_policy"] = view.guard_policy
        state["allow_guard_disable"] = view.allow_guard_disable

        # -- body with a hard cap (after auth, so strangers cannot make us buffer) ---------------------
        body = b""
        if method in _BODY_METHODS:
            try:
                _check_length(scope, rt.settings.server.max_body_bytes)
                body = await _read_body(receive, rt.settings.server.max_body_bytes)
            except OpenAIError as e:
                await _error_response(e)(scope, receive, send)
                return
            receive = _replay(body, receive)

        # -- admission ---------------------------------------------------------------------------
        slot: Slot | None = None
        slots: list[Slot] = []          # the request's slot, then one per further choice (admit_more)
        if rt.admission is not None and method == "POST" and path in rt.ops.admission.paths:
            try:
                slot = await rt.admission.acquire(principal.tenant, view.quota)
            except Rejected as e:
                metrics.REQUESTS.labels(_route_label(path), str(e.status)).inc()
                await _error_response(e)(scope, receive, send)
                return
            slots.append(slot)
            admission, quota = rt.admission, view.quota

            async def admit_more(n: int) -> None:
                if len(slots) + n > quota.max_in_flight:
                    raise OpenAIError(
                        400, f"This request asks for {len(slots) + n} choices; tenant '{principal.tenant}' may "
                        f"have at most {quota.max_in_flight} in flight. Send fewer prompts or a smaller 'n'.",
                        param="n", code="too_many_choices")
                for _ in range(n):
                    # a refusal here propagates as the request's 429/503; the slots taken so far are released
                    # with the others below
                    slots.append(await admission.acquire(principal.tenant, quota))

            state["admit_more"] = admit_more

        # -- run it ------------------------------------------------------------------------------
        srv = rt.settings.server
        t_tok = STREAM_TIMEOUTS.set(
            StreamTimeouts(first_token_s=srv.first_token_timeout_s, idle_s=srv.idle_token_timeout_s,
                           total_s=srv.request_timeout_s, started=arrived)
        )
        # guard slots are shared round-robin between tenants: a flooding tenant waits behind its own requests
        g_tok = GUARD_CLIENT.set(principal.tenant)
        sink: list[StreamStats] = []
        s_tok = metrics.STATS_SINK.set(sink)
        audit = rt.audit if path in rt.ops.admission.paths else None
        resp: dict[str, Any] = {"status": 0, "request_id": None, "body": bytearray(), "streamed": False}
        want_content = audit is not None and audit.settings.include_content

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                resp["status"] = int(message["status"])
                for k, v in message.get("headers") or []:
                    if k.lower() == b"x-request-id":
                        resp["request_id"] = v.decode("latin-1")
                    elif k.lower() == b"content-type" and v.startswith(b"text/event-stream"):
                        resp["streamed"] = True
                if resp["request_id"] is None:
                    # Refusals and errors get an id too, so a client's report can be matched to the audit log.
                    rid = "req-" + secrets.token_hex(12)
                    resp["request_id"] = rid
                    message["headers"] = [*(message.get("headers") or []), (b"x-request-id", rid.encode())]
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if audit is not None and (want_content or resp["status"] == 400) and len(resp["body"]) < _CAPTURE_CAP:
                    resp["body"] += chunk
                if slots and rt.admission is not None and (
                    not message.get("more_body", False) or (resp["streamed"] and chunk.endswith(sse.DONE))
                ):
                    # Free the slots before the client can see the end of the response ([DONE], or the last
                    # byte): a client that sends its next request at once must find them free, even when this
                    # task is slow to reach its ``finally`` on a busy event loop. Releasing twice is a no-op.
                    await asyncio.shield(_release_all(rt.admission, slots))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            STREAM_TIMEOUTS.reset(t_tok)
            GUARD_CLIENT.reset(g_tok)
            metrics.STATS_SINK.reset(s_tok)
            if slots and rt.admission is not None:
                # Shielded: a client disconnect cancels this task, and the slots must still come back.
                await asyncio.shield(_release_all(rt.admission, slots))
            if audit is not None:
                written = None
                try:
                    written = audit_request(audit, rt.app.state.guard, principal, view.guard_policy,
                                            state.get("guard_policy_applied"), path, body, resp, sink)
                except Exception:   # auditing must never turn a served response into an error
                    log.exception("audit failed for %s", resp["request_id"])
                if written is not None:
                    # The response is out; the request ends once its lines are in the file (written by the audit
                    # thread, so the loop keeps serving meanwhile). Shielded: a disconnect must not drop them.
                    await asyncio.shield(asyncio.wrap_future(written))


# Headers of ours a request may carry. Any other ``X-NextGuard-*`` is refused, not ignored: a misspelt
# operator header would otherwise leave the caller believing it took effect.
OPERATOR_HEADERS = frozenset({TENANT_HEADER.lower()})


def _unknown_operator_header(scope: Scope) -> OpenAIError | None:
    for k, _ in scope.get("headers") or []:
        name = k.decode("latin-1").lower()
        if name.startswith("x-nextguard-") and name not in OPERATOR_HEADERS:
            import difflib

            close = difflib.get_close_matches(name, OPERATOR_HEADERS, n=1)
            hint = f"; did you mean '{TENANT_HEADER}'?" if close else ""
            return OpenAIError(400, f"Unknown header '{name}'{hint} Known: {TENANT_HEADER}.", param=name,
                               code="unknown_header")
    return None


def _acting_for(principal: Principal, header: bytes | None) -> Principal:
    """The suite worker runs a tenant's batch lines and suite model calls with the operator key, naming the
    tenant in ``TENANT_HEADER``: they are served as that tenant (its guard policy, grants, quotas, audit
    attribution), not as the operator. Only the operator key may do this; from any other key it is a 403,
    never a way to borrow another tenant's policy."""
    if header is None:
        return principal
    if not principal.admin:
        raise OpenAIError(403, f"Only the operator key may send {TENANT_HEADER}; drop the header.",
                          param=TENANT_HEADER, code="tenant_header_not_allowed")
    tenant = header.decode("latin-1").strip()
    if not tenant or len(tenant) > 128 or not tenant.isprintable():
        raise OpenAIError(400, f"{TENANT_HEADER} must name a tenant (1 to 128 printable characters).",
                          param=TENANT_HEADER, code="invalid_tenant_header")
    # key_id stays the operator's, so the audit shows who sent it as well as whose it was
    return Principal(tenant=tenant, key_id=principal.key_id, admin=False)


def _metrics_client_allowed(scope: Scope, networks: tuple[IPNetwork, ...]) -> bool:
    """The socket peer, never a forwarded header (a client could write one)."""
    if not networks:
        return True
    client = scope.get("client")
    try:
        addr = ipaddress.ip_address(client[0]) if client else None
    except ValueError:
        return False
    return addr is not None and any(addr in n for n in networks)


def _check_length(scope: Scope, limit: int) -> None:
    """Refuse on the declared length alone, before reading a byte."""
    for k, v in scope.get("headers") or []:
        if k == b"content-length":
            try:
                too_big = int(v) > limit
            except ValueError:
                raise OpenAIError(400, "Content-Length is not a number.", code="invalid_request") from None
            if too_big:
                raise OpenAIError(413, f"Request body larger than {limit} bytes.", code="request_too_large")


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise OpenAIError(413, f"Request body larger than {limit} bytes.", code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()      # after the body: disconnect notifications

    return replay
