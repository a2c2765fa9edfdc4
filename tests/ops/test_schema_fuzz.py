"""Schemathesis against our own OpenAPI schema, in process, with the scripted engine: no input the schema
admits (or nearly admits) may produce a 5xx; every 4xx is in the OpenAI error shape; every stream ends
with ``[DONE]``. Bounded: ``MAX_EXAMPLES`` per operation, derandomised so CI runs are repeatable."""

from __future__ import annotations

import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from gateway.ops.config import OpsSettings
from gateway.redis_local import reachable
from tests.doubles import ScriptedEngine
from tests.ops.conftest import REDIS_URL, dead_redis_url, make_app

MAX_EXAMPLES = 25

# Schemathesis reads the schema when this module is imported, so the app is built here. Its test client
# runs every call on a fresh event loop, which the Redis-backed admission path must survive; without a
# Redis the per-process fallback is what gets exercised. Admission keys expire on their own (lease TTL).
APP, _ = make_app(ScriptedEngine(), Path(tempfile.mkdtemp(prefix="ng-fuzz-")),
                  redis_url=REDIS_URL if reachable(REDIS_URL) else dead_redis_url(),
                  prefix=f"ngtest-fuzz-{uuid.uuid4().hex[:8]}", ops=OpsSettings())
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
SEEN: dict[str, set[int]] = defaultdict(set)      # "METHOD path" -> statuses observed


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    if isinstance(case.body, dict) and "model" in case.body:
        # Random model names only ever reach the 404; aim the generated bodies at the served model.
        case.body["model"] = "scripted"
    resp = case.call()
    SEEN[f"{case.method} {case.path}"].add(resp.status_code)
    where = f"{case.method} {case.path} body={case.body!r:.300}"
    assert resp.status_code < 500, f"{where} -> {resp.status_code} {resp.text[:500]}"
    ctype = resp.headers.get("content-type") or [""]    # schemathesis keeps header values as lists
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    if resp.status_code >= 400:
        body = resp.json()
        assert set(body) == {"error"} and body["error"]["message"], f"{where} -> {resp.text[:300]}"
    elif ctype.startswith("text/event-stream"):
        assert resp.text.endswith("data: [DONE]\n\n"), f"{where} -> {resp.text[-300:]}"


def test_schema_lists_the_generation_routes() -> None:
    paths = APP.openapi()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(paths)


def test_fuzz_reached_the_happy_path() -> None:
    """Guards against a fuzz run that only ever produced 4xx (it would prove nothing about the 200 path)."""
    if not SEEN:
        pytest.skip("the fuzz test did not run in this session")
    assert 200 in SEEN["POST /v1/chat/completions"], dict(SEEN)
    assert 200 in SEEN["POST /v1/completions"], dict(SEEN)
    if reachable(REDIS_URL):
        # every call ran on its own loop; the limits stayed in Redis (no fallback was needed)
        assert APP.state.ops.admission.shared


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
