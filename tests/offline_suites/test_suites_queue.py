"""The queue against the real Redis at 127.0.0.1:6379 (unique key prefix per test, cleaned up):
burst workers, idempotent enqueue, retry bound, cancellation, a worker killed mid-job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tests.offline_suites.queue_suites  # noqa: F401  (registers qt-* suites)
from offline_suites.config import SuiteSettings
from offline_suites.jobs import RunStore, cancel_run, submit_run
from offline_suites.keys import Keys
from offline_suites.worker import build_worker

pytestmark = pytest.mark.redis
REDIS_URL = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parents[2]


async def _burst(settings: SuiteSettings) -> Any:
    w = build_worker(settings, REDIS_URL, burst=True, poll_delay=0.02, handle_signals=False)
    try:
        await w.main()
    finally:
        await w.close()
    return w


async def _record(aredis: Any, s: SuiteSettings, run_id: str) -> dict[str, Any]:
    rec = await RunStore(aredis, Keys(s.key_prefix), s.keep_runs_s).get(run_id)
    assert rec is not None
    return rec


async def test_burst_worker_runs_to_success(aredis: Any, suite_settings: SuiteSettings) -> None:
    rec, created = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 7}, seed=3)
    assert created and rec["status"] == "queued" and rec["attempts"] == 0
    w = await _burst(suite_settings)
    assert w.jobs_complete == 1 and w.jobs_failed == 0
    rec = await _record(aredis, suite_settings, rec["id"])
    assert rec["status"] == "succeeded" and rec["progress"] == 1.0 and rec["attempts"] == 1
    assert rec["result"]["metrics"] == {"value": 7} and rec["result"]["summary"]["gates_passed"]
    assert (suite_settings.results_dir / rec["id"] / "value.json").read_text().strip().startswith("{")



async def test_finished_runs_outlive_the_redis_record(aredis: Any, suite_settings: SuiteSettings) -> None:
    """Checks, claims and provenance are on disk next to the artifacts (result.json, and the run record as
    run.json); once the Redis hash has expired the store, and so GET /v1/runs/{id}, reads them from there."""
    ok, _ = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 5}, seed=0)
    bad, _ = await submit_run(aredis, suite_settings, "qt-crash", "smoke", None, seed=0)
    await _burst(suite_settings)
    keys = Keys(suite_settings.key_prefix)
    for run_id in (ok["id"], bad["id"]):
        assert (suite_settings.results_dir / run_id / "run.json").is_file()
        await aredis.delete(keys.run(run_id))           # what the TTL does after keep_runs_s
    store = RunStore(aredis, keys, suite_settings.keep_runs_s, suite_settings.results_dir)
    rec = await store.get(ok["id"])
    assert rec is not None and rec["status"] == "succeeded" and rec["result"]["metrics"] == {"value": 5}
    assert rec["result"]["checks"] and "provenance" in rec["result"] and "result.json" in rec["artifacts"]
    on_disk = json.loads((suite_settings.results_dir / ok["id"] / "result.json").read_text())
    assert on_disk["checks"] == rec["result"]["checks"]
    failed = await store.get(bad["id"])
    assert failed is not None and failed["status"] == "failed" and failed["error"]
    # a failed run is queued again on resubmission, even when only its file remains
    again, created = await submit_run(aredis, suite_settings, "qt-crash", "smoke", None, seed=0)
    assert created and again["status"] == "queued"
    # without a results dir (or for a name that is not a run id) nothing is read from disk
    assert await RunStore(aredis, keys, suite_settings.keep_runs_s).get(ok["id"]) is None
    assert await store.get("../" + ok["id"]) is None

async def test_idempotent_enqueue(aredis: Any, suite_settings: SuiteSettings) -> None:
    a, ca = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 2}, seed=0)
    b, cb = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 2}, seed=0)
    c, cc = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 2}, seed=1)
    assert a["id"] == b["id"] and ca and not cb
    assert c["id"] != a["id"] and cc
    assert await aredis.zcard(Keys(suite_settings.key_prefix).queue) == 2
    w = await _burst(suite_settings)
    assert w.jobs_complete == 2
    # once succeeded, resubmitting returns the stored result instead of running again
    d, cd = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 2}, seed=0)
    assert not cd and d["status"] == "succeeded" and await aredis.zcard(Keys(suite_settings.key_prefix).queue) == 0


async def test_retry_bound_on_transient_errors(aredis: Any, suite_settings: SuiteSettings) -> None:
    rec, _ = await submit_run(aredis, suite_settings, "qt-flaky", "smoke", None, seed=0)
    w = await _burst(suite_settings)
    rec = await _record(aredis, suite_settings, rec["id"])
    assert rec["status"] == "failed"
    assert rec["attempts"] == suite_settings.max_tries == 3
    assert w.jobs_retried == suite_settings.max_tries - 1
    assert "TransientError" in rec["error"]


async def test_deterministic_error_fails_without_retry(aredis: Any, suite_settings: SuiteSettings) -> None:
    rec, _ = await submit_run(aredis, suite_settings, "qt-crash", "smoke", None, seed=0)
    w = await _burst(suite_settings)
    rec = await _record(aredis, suite_settings, rec["id"])
    assert rec["status"] == "failed" and rec["attempts"] == 1 and w.jobs_retried == 0
    assert "ValueError: scripted bug" in rec["error"]
    # a failed run may be submitted again and runs again
    again, created = await submit_run(aredis, suite_settings, "qt-crash", "smoke", None, seed=0)
    assert created and again["status"] == "queued"


async def test_cancel_queued_run(aredis: Any, suite_settings: SuiteSettings) -> None:
    rec, _ = await submit_run(aredis, suite_settings, "qt-quick", "smoke", {"value": 5}, seed=0)
    rec = await cancel_run(aredis, suite_settings, rec["id"])
    assert rec["status"] == "cancelled"
    await _burst(suite_settings)
    rec = await _record(aredis, suite_settings, rec["id"])
    assert rec["status"] == "cancelled" and rec["result"] is None and rec["attempts"] == 0


async def test_cancel_running_run(aredis: Any, suite_settings: SuiteSettings) -> None:
    rec, _ = await submit_run(aredis, suite_settings, "qt-slow", "smoke", {"steps": 400, "sleep_s": 0.05}, seed=0)
    worker = asyncio.create_task(_burst(suite_settings))
    for _ in range(200):
        cur = await _record(aredis, suite_settings, rec["id"])
        if cur["status"] == "running" and cur["progress"] > 0:
            break
        await asyncio.sleep(0.05)
    assert cur["status"] == "running"
    await cancel_run(aredis, suite_settings, rec["id"])
    await asyncio.wait_for(worker, 30)
    cur = await _record(aredis, suite_settings, rec["id"])
    assert cur["status"] == "cancelled" and cur["cancel_requested"] and 0 < cur["progress"] < 1


@pytest.mark.slow
async def test_killed_worker_job_is_retried_not_lost(aredis: Any, suite_settings: SuiteSettings,
                                                     tmp_path: Path) -> None:
    marker = tmp_path / "first-attempt"
    rec, _ = await submit_run(aredis, suite_settings, "qt-hang-once", "smoke", {"marker": str(marker)}, seed=0)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "offline_suites" / "worker_proc.py"), suite_settings.key_prefix,
                             str(suite_settings.results_dir)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            cur = await _record(aredis, suite_settings, rec["id"])
            if cur["status"] == "running" and marker.exists():
                break
            await asyncio.sleep(0.1)
        assert cur["status"] == "running" and cur["attempts"] == 1
    finally:
        proc.send_signal(signal.SIGKILL)      # no shutdown hooks: the job is orphaned mid-run
        proc.wait(10)
    # arq redelivers once the dead worker's in-progress key expires (its job timeout 5 s + 10 s)
    w = await asyncio.wait_for(_burst(suite_settings), 60)
    cur = await _record(aredis, suite_settings, rec["id"])
    assert w.jobs_complete == 1
    assert cur["status"] == "succeeded" and cur["attempts"] == 2 and cur["result"]["metrics"] == {"value": 1}
