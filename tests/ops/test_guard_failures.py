"""Guard failures are counted under both policies: ``gateway_guard_failures_total{policy="fail_closed"}`` for
the ``guard_error`` cut, ``{policy="fail_open"}`` when the policy lets the stream go on unscored; a fail-open
also leaves an audit line. A scripted guard that breaks mid-stream, then the real NExT-Guard runtime whose
model fails (it reports through ``guard.api.FAIL_OPEN_SINK``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway import metrics
from guard.api import GuardPolicy, SafetyCut, report_fail_open
from guard.text import Conversation
from inference.types import TokenDelta
from tests.doubles import ScriptedEngine, ScriptedGuard
from tests.gateway.test_serving import parse_sse
from tests.ops.conftest import chat, client, dead_redis_url, make_app


@dataclass
class BreakingGuard(ScriptedGuard):
    """Scores ``break_after`` deltas, then its scorer raises. Applies the failure policy the way
    ``guard.service.NextGuard`` does: fail closed -> a ``guard_error`` cut; fail open -> report the failure
    and pass the rest of the stream unscored. ``prompt_fails``: the prompt gate raises too."""

    break_after: int = 1
    prompt_fails: bool = False

    async def check_prompt(self, conversation: Conversation, policy: GuardPolicy) -> SafetyCut | None:
        if not self.prompt_fails:
            return None
        err = RuntimeError("prompt scorer crashed")
        if policy.fail_closed:
            return SafetyCut(category="guard_error", score=0.0, threshold=0.0, token_offset=0, gate="prompt",
                             decision="guard_error")
        report_fail_open("prompt", 0, err)
        return None

    async def watch(self, conversation: Conversation, deltas: AsyncIterator[TokenDelta],
                    policy: GuardPolicy) -> AsyncIterator[TokenDelta | SafetyCut]:
        released = 0
        it = deltas.__aiter__()
        async for d in it:
            if released < self.break_after:
                d.scores = [0.1] * len(d.token_ids)
                released += len(d.token_ids)
                yield d
                continue
            err = RuntimeError("scorer crashed")
            if policy.fail_closed:
                yield SafetyCut(category="guard_error", score=0.0, threshold=0.0, token_offset=released,
                                decision="guard_error")
                return
            report_fail_open("response", released, err)
            yield d
            async for rest in it:
                yield rest
            return


def failures() -> tuple[float, float]:
    return (metrics.GUARD_FAILURES.labels("fail_closed")._value.get(),
            metrics.GUARD_FAILURES.labels("fail_open")._value.get())


async def stream(app: Any, body: dict[str, Any] | None = None) -> list[Any]:
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=body or chat())
    assert r.status_code == 200, r.text
    return parse_sse(r.text)


def text_and_finish(frames: list[Any]) -> tuple[str, list[Any]]:
    assert frames[-1] == "[DONE]"
    assert not any("error" in f for f in frames[:-1]), frames
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames[:-1] if f["choices"])
    return text, [f["choices"][0] for f in frames[:-1] if f["choices"] and f["choices"][0].get("finish_reason")]


def audit_lines(rt: Any) -> list[dict[str, Any]]:
    assert rt.audit is not None and rt.audit.path is not None
    return [json.loads(x) for x in rt.audit.path.read_text().splitlines()]


async def test_fail_open_stream_completes_and_is_counted(tmp_path: Path) -> None:
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), guard=BreakingGuard(break_after=1),
                       guard_policy=GuardPolicy(enabled=True, fail_closed=False))
    closed0, open0 = failures()
    text, finishes = text_and_finish(await stream(app))
    assert text == "Hello, world!"                                   # the rest went out, unscored
    assert [f["finish_reason"] for f in finishes] == ["stop"]
    assert failures() == (closed0, open0 + 1)
    (line,) = audit_lines(rt)
    assert (line["decision"], line["gate"], line["token_offset"], line["error"]) == ("fail_open", "response", 1,
                                                                                    "RuntimeError")
    assert line["fail_closed"] is False


async def test_fail_closed_cut_is_counted(tmp_path: Path) -> None:
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), guard=BreakingGuard(break_after=1),
                       guard_policy=GuardPolicy(enabled=True, fail_closed=True))
    closed0, open0 = failures()
    text, finishes = text_and_finish(await stream(app))
    assert text == "Hello"                                           # nothing after the failure left
    (fin,) = finishes
    assert fin["finish_reason"] == "content_filter"
    assert fin["safety"]["decision"] == "guard_error" and fin["safety"]["token_offset"] == 1
    assert failures() == (closed0 + 1, open0)
    (line,) = audit_lines(rt)
    assert line["decision"] == "guard_error"


async def test_prompt_gate_fail_open_is_counted_too(tmp_path: Path) -> None:
    """Prompt gate and response gate both fail, policy fail-open: the request is served, two failures counted."""
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(),
                       guard=BreakingGuard(break_after=0, prompt_fails=True),
                       guard_policy=GuardPolicy(enabled=True, fail_closed=False))
    closed0, open0 = failures()
    text, _ = text_and_finish(await stream(app))
    assert text == "Hello, world!"
    assert failures() == (closed0, open0 + 2)
    assert sorted(x["gate"] for x in audit_lines(rt)) == ["prompt", "response"]
    async with client(app) as c:          # the non-streamed path records the same way
        r = await c.post("/v1/completions", json={"model": "scripted", "prompt": "hi"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hello, world!"
    assert failures() == (closed0, open0 + 4)


@pytest.mark.parametrize("fail_closed", [True, False], ids=["fail_closed", "fail_open"])
async def test_real_guard_runtime_failure_is_counted(tmp_path: Path, fail_closed: bool) -> None:
    """guard.service.NextGuard with a model that raises on every step (the guard tests' runner double)."""
    from tests.guard.conftest import make_guard, tiny_tokenizer

    guard, _, _ = make_guard(tiny_tokenizer(), tmp_path, fail=True, prompt_gate=False)
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), guard=guard,
                      guard_policy=GuardPolicy(enabled=True, fail_closed=fail_closed))
    closed0, open0 = failures()
    try:
        text, finishes = text_and_finish(await stream(app))
    finally:
        await guard.aclose()
    if fail_closed:
        assert text == "" and finishes[0]["safety"]["decision"] == "guard_error"
        assert failures() == (closed0 + 1, open0)
    else:
        assert text == "Hello, world!" and [f["finish_reason"] for f in finishes] == ["stop"]
        assert failures() == (closed0, open0 + 1)
