"""Audit assembly: the lines of one finished request, from what the middleware saw (the request body, the
response status and body, the per-choice :class:`~gateway.serving.common.StreamStats`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
from typing import Any

from gateway import metrics
from gateway.ops.audit import AuditLog, prompt_cut_from_error, released_text
from gateway.ops.auth import Principal
from gateway.serving.common import GUARD_OVERRIDE_REFUSED, StreamStats


def audit_request(audit: AuditLog, guard: Any, principal: Principal, policy: Any, applied: Any, path: str,
                  body: bytes, resp: dict[str, Any], sink: list[StreamStats]) -> concurrent.futures.Future[None] | None:
    """Hand the audit lines of one finished request to the writer: its guard decisions (prompt refusal read
    back from our own 400, each choice's cut, fail-open or pass), a switched-off guard and refused or applied
    overrides. ``guard`` is the app's guard (None: no guard on this deployment); ``policy`` the tenant's
    policy, ``applied`` what the serving code resolved for the request. None when there is nothing to log."""
    req: dict[str, Any] = {}
    with contextlib.suppress(ValueError, TypeError):
        parsed = json.loads(body) if body else {}
        req = parsed if isinstance(parsed, dict) else {}
    prompt_cut = prompt_cut_from_error(bytes(resp["body"]), req.get("model")) if resp["status"] == 400 else None
    if prompt_cut is not None:
        metrics.GUARD_DECISIONS.labels(prompt_cut["decision"], str(prompt_cut["category"]),
                                       str(req.get("model"))).inc()
        if prompt_cut["decision"] == "guard_error":
            metrics.GUARD_FAILURES.labels("fail_closed").inc()
    # ``applied``: the policy the serving code resolved for this request (overrides and permission included)
    effective = applied if applied is not None else policy
    guard_on = guard is not None and bool(getattr(effective, "enabled", False))
    overrides = _asked_overrides(req.get("guard"))
    guard_disabled = (
        guard is not None and bool(getattr(policy, "enabled", False)) and not guard_on
        and overrides.get("enabled") is False
    )
    refused = _override_refusal(bytes(resp["body"])) if resp["status"] == 400 else None
    if prompt_cut is None and not sink and refused is None:
        return None
    content = None
    if audit.settings.include_content:
        content = {
            "prompt": req.get("messages", req.get("prompt")),
            "completion": released_text(bytes(resp["body"]), resp["streamed"]),
        }
    records = audit.records(
        request_id=resp["request_id"],
        tenant=principal.tenant,
        key_id=principal.key_id,
        route=path,
        status=resp["status"],
        stats=sink,
        prompt_cut=prompt_cut,
        guarded=guard_on,
        fail_closed=bool(getattr(policy, "fail_closed", True)),
        content=content,
        overrides=overrides or None,
        guard_disabled=guard_disabled,
        override_refused=refused,
    )
    return audit.write(records) if records else None


_OVERRIDE_FIELDS = ("enabled", "prompt_threshold", "response_threshold", "hold_back")


def _asked_overrides(guard: Any) -> dict[str, Any]:
    """The guard overrides a request sent (``include_scores`` changes what is shown, not what is cut)."""
    if not isinstance(guard, dict):
        return {}
    return {k: guard[k] for k in _OVERRIDE_FIELDS if guard.get(k) is not None}


def _override_refusal(body: bytes) -> str | None:
    """The field of a refused guard override, read back from our own 400."""
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(err, dict) or err.get("code") != GUARD_OVERRIDE_REFUSED:
        return None
    return str(err.get("param"))
