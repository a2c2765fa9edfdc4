"""Metrics fed by the stream stats (guard timing, held-back tokens, failures), the audit log (ids, no
content unless configured), per-tenant guard policy on request.state, and multiprocess mode."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import APIRouter, Request

from gateway import metrics
from gateway.ops.audit import AuditLog
from gateway.ops.config import AuditSettings, GuardPolicyOverrides, OpsSettings, TenantSettings
from gateway.serving.common import StreamStats, choice_stream
from guard.api import GuardPolicy, SafetyCut
from inference.types import SamplingOptions
from tests.doubles import ScriptedEngine, ScriptedGuard
from tests.ops.conftest import chat, client, dead_redis_url, make_app

ROOT = Path(__file__).resolve().parents[2]


async def _drain(it: AsyncIterator[object]) -> list[object]:
    return [x async for x in it]


async def test_choice_stream_measures_guard_delay_and_held_back() -> None:
    engine = ScriptedEngine()              # "Hello", ",", " world", "!"
    stats = StreamStats(route="chat", model="scripted")
    items = await _drain(choice_stream(engine, ScriptedGuard(trigger="world"), GuardPolicy(), [1, 2], "hi",
                                       SamplingOptions(max_tokens=8), "r1", stats))
    assert isinstance(items[-1], SafetyCut)
    assert len(stats.guard_step) == 2      # "Hello" and "," were released after the guard saw them
    assert all(0 <= dt < 1 for dt in stats.guard_step)
    assert stats.held_back == [1]          # " world" was received and never sent


async def test_record_counts_guard_metrics() -> None:
    st = StreamStats(route="chat", model="m-obs")
    st.cuts.append(SafetyCut(category="guard_error", score=0, threshold=0, token_offset=3, decision="guard_error"))
    st.held_back.append(2)
    st.guard_step.extend([0.001, 0.002, 0.003])
    fails0 = metrics.GUARD_FAILURES.labels("fail_closed")._value.get()
    metrics.record(st)
    assert metrics.GUARD_FAILURES.labels("fail_closed")._value.get() == fails0 + 1
    assert metrics.GUARD_DECISIONS.labels("guard_error", "guard_error", "m-obs")._value.get() == 1
    text = metrics.render()[0].decode()
    assert 'gateway_guard_step_seconds_count{model="m-obs"} 3.0' in text
    assert 'gateway_guard_held_back_tokens_sum{model="m-obs"} 2.0' in text
    assert 'gateway_cut_position_tokens_count{model="m-obs"} 1.0' in text


async def test_audit_lines_without_content(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    ops = OpsSettings(audit=AuditSettings(path=log))
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), ops=ops,
                      guard=ScriptedGuard(trigger="world"), guard_policy=GuardPolicy())
    async with client(app) as c:
        r1 = await c.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "secret prompt"}]))
        r2 = await c.post("/v1/chat/completions",
                          json=chat(stream=False, messages=[{"role": "user", "content": "forbidden words"}]))
        r3 = await c.post("/v1/chat/completions", json=chat(max_tokens=2))
    assert r1.status_code == 200 and r2.status_code == 400 and r3.status_code == 200
    raw = log.read_text()
    assert "secret prompt" not in raw and "forbidden words" not in raw and "Hello" not in raw
    lines = [json.loads(x) for x in raw.splitlines()]
    assert [(x["gate"], x["decision"]) for x in lines] == [("response", "intervened"), ("prompt", "intervened"),
                                                          ("response", "pass")]
    cut, prompt, ok = lines
    assert cut["request_id"] == r1.headers["x-request-id"] and cut["request_id"].startswith("chatcmpl-")
    assert cut["tenant"] == "default" and cut["category"] == "test"
    assert cut["token_offset"] == 2 and cut["feature_ids"] == [3, 11] and cut["score"] == 0.8
    assert prompt["request_id"] == r2.headers["x-request-id"] and prompt["feature_ids"] == [7]
    assert prompt["status"] == 400 and prompt["model"] == "scripted"
    assert ok["completion_tokens"] == 2 and ok["finish_reasons"] == ["length"]
    assert all("content" not in x for x in lines)


async def test_audit_with_content_when_configured(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    ops = OpsSettings(audit=AuditSettings(path=log, include_content=True))
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), ops=ops,
                      guard=ScriptedGuard(trigger="world"), guard_policy=GuardPolicy())
    async with client(app) as c:
        await c.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "secret prompt"}]))
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]
    assert line["content"]["prompt"] == [{"role": "user", "content": "secret prompt"}]
    assert line["content"]["completion"] == ["Hello,"]        # what the client actually received


async def test_tenant_policy_on_request_state(tmp_path: Path) -> None:
    ops = OpsSettings(tenants={"default": TenantSettings(
        guard=GuardPolicyOverrides(response_threshold=0.9, fail_closed=False, categories=("violence",)),
        allow_guard_disable=False)})
    app, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), ops=ops,
                      guard=ScriptedGuard(), guard_policy=GuardPolicy(hold_back=3))
    router = APIRouter()

    @router.get("/v1/test-policy")
    async def policy(request: Request) -> dict[str, object]:
        p = request.state.guard_policy
        return {"tenant": request.state.tenant, "thr": p.response_threshold, "fail_closed": p.fail_closed,
                "categories": list(p.categories), "hold_back": p.hold_back,
                "allow_disable": request.state.allow_guard_disable}

    app.include_router(router)
    async with client(app) as c:
        got = (await c.get("/v1/test-policy")).json()
    assert got == {"tenant": "default", "thr": 0.9, "fail_closed": False, "categories": ["violence"],
                   "hold_back": 3, "allow_disable": False}   # hold_back kept from the deployment policy


def test_multiprocess_mode_sums_workers(tmp_path: Path) -> None:
    """Two worker processes record into PROMETHEUS_MULTIPROC_DIR; a third renders the sum."""
    mp = tmp_path / "prom"
    mp.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp), "PYTHONPATH": str(ROOT)}
    worker = textwrap.dedent("""
        from gateway import metrics
        from gateway.serving.common import StreamStats
        s = StreamStats(route="chat", model="mp")
        s.guard_step.append(0.002)
        metrics.REQUESTS.labels("chat", "200").inc()
        metrics.IN_FLIGHT.set(3)
        metrics.record(s)
    """)
    for _ in range(2):
        subprocess.run([sys.executable, "-c", worker], env=env, check=True, cwd=ROOT, timeout=120)
    out = subprocess.run([sys.executable, "-c", "from gateway import metrics; print(metrics.render()[0].decode())"],
                         env=env, check=True, cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert 'gateway_requests_total{route="chat",status="200"} 2.0' in out
    assert 'gateway_guard_step_seconds_count{model="mp"} 2.0' in out
    # livesum adds the workers' gauges; a dead worker's file stays until prometheus_client's
    # mark_process_dead(pid) removes it (docs/scaling.md: call it from the process manager's exit hook).
    assert "gateway_in_flight_requests 6.0" in out
    from prometheus_client import multiprocess

    for f in mp.glob("gauge_livesum_*.db"):
        multiprocess.mark_process_dead(int(f.stem.rsplit("_", 1)[1]), str(mp))
    out = subprocess.run([sys.executable, "-c", "from gateway import metrics; print(metrics.render()[0].decode())"],
                         env=env, check=True, cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "gateway_in_flight_requests 0.0" in out


async def test_timeout_is_counted_when_stats_are_passed() -> None:
    from gateway.errors import OpenAIError
    from gateway.serving.common import STREAM_TIMEOUTS, StreamTimeouts

    engine = ScriptedEngine(delay=0.3)
    stats = StreamStats(route="chat", model="m-timeout")
    tok = STREAM_TIMEOUTS.set(StreamTimeouts(first_token_s=0.05))
    try:
        try:
            await _drain(choice_stream(engine, None, GuardPolicy(enabled=False), [1], "hi", SamplingOptions(), "r-t",
                                       stats))
        except OpenAIError as e:
            assert e.status == 504 and e.code == "first_token_timeout"
        else:
            raise AssertionError("no timeout")
    finally:
        STREAM_TIMEOUTS.reset(tok)
    assert stats.error == "first_token_timeout" and engine.num_running() == 0
    before = metrics.ERRORS.labels("first_token_timeout")._value.get()
    metrics.record(stats)
    assert metrics.ERRORS.labels("first_token_timeout")._value.get() == before + 1


def test_bench_load_cli_arguments() -> None:
    import argparse

    from gateway.ops.cli import add_bench_subcommands

    p = argparse.ArgumentParser()
    add_bench_subcommands(p.add_subparsers(dest="bench", required=True))
    args = p.parse_args(["load", "--url", "http://127.0.0.1:1", "--concurrency", "8", "--duration", "2", "--storm", "0"])
    assert (args.url, args.concurrency, args.duration, args.storm, args.max_tokens) == ("http://127.0.0.1:1", 8, 2.0, 0, 32)
    assert callable(args.func)


async def test_a_stalled_audit_file_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    """The audit file is a FIFO nobody reads for a while: opening it for writing blocks. Written on the
    event loop, that would freeze every stream for as long; written by the audit thread, the loop ticks on."""
    log = tmp_path / "audit.jsonl"
    os.mkfifo(log)
    got: list[str] = []

    def late_reader() -> None:
        time.sleep(1.5)
        with open(log, encoding="utf-8") as fh:
            got.append(fh.readline())

    reader = threading.Thread(target=late_reader, daemon=True)
    ops = OpsSettings(audit=AuditSettings(path=log, max_bytes=0))
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), ops=ops,
                       guard=ScriptedGuard(trigger="world"), guard_policy=GuardPolicy())
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = loop.time()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    reader.start()
    try:
        async with client(app) as c:
            r = await c.post("/v1/chat/completions", json=chat())
    finally:
        done.set()
        await tick
    reader.join(5)
    await rt.aclose()
    assert r.status_code == 200
    assert json.loads(got[0])["decision"] == "intervened"    # the line did arrive, once the reader came
    assert max(gaps) < 0.75, f"event loop stalled {max(gaps):.2f} s on the audit write"


def test_audit_log_rotates_by_size(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    audit = AuditLog(AuditSettings(path=log, max_bytes=2000, backups=2), tmp_path)
    for i in range(200):
        audit.write([{"n": i, "decision": "pass", "pad": "x" * 40}])
    audit.close()
    kept = [log, log.with_name("audit.jsonl.1"), log.with_name("audit.jsonl.2")]
    assert all(p.exists() for p in kept) and not log.with_name("audit.jsonl.3").exists()
    assert all(p.stat().st_size <= 2000 for p in kept)
    numbers = [json.loads(x)["n"] for p in reversed(kept) for x in p.read_text().splitlines()]
    # whole lines only, oldest backup first, and nothing missing between the kept files
    assert numbers == list(range(numbers[0], 200))


async def test_audit_lines_handed_over_are_written_on_shutdown(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    app, rt = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(),
                       ops=OpsSettings(audit=AuditSettings(path=log)))
    assert rt.audit is not None
    for i in range(500):
        rt.audit.write([{"n": i}])      # not awaited: the app shuts down with the lines still queued
    await rt.aclose()
    assert [json.loads(x)["n"] for x in log.read_text().splitlines()] == list(range(500))
