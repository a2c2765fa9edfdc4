"""64 concurrent streams with 0 errors, then a disconnect storm that must leave the engine with no running
request. The real app and a real uvicorn on loopback (in this process), the scripted engine behind it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gateway.loadbench import bench, pct
from gateway.ops.config import AdmissionSettings, OpsSettings
from tests.conftest import free_port
from tests.doubles import ScriptedEngine
from tests.ops.conftest import make_app


@contextlib.asynccontextmanager
async def serve_in_process(app: Any) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the test runner owns signals
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def test_pct() -> None:
    assert pct([], 0.5) is None
    assert pct([3.0, 1.0, 2.0], 0.5) == 2.0
    assert pct([float(i) for i in range(1, 101)], 0.99) == 99.0


@pytest.mark.redis
async def test_64_streams_zero_errors_and_disconnect_storm(tmp_path: Path, redis_url: str, prefix: str) -> None:
    engine = ScriptedEngine(pieces=[f"w{i} " for i in range(16)], delay=0.005)
    ops = OpsSettings(admission=AdmissionSettings(max_in_flight=256, tenant_max_in_flight=256))
    app, rt = make_app(engine, tmp_path, redis_url=redis_url, prefix=prefix, ops=ops)
    async with serve_in_process(app) as base:
        report = await bench(base, model=None, api_key=None, concurrency=64, duration_s=3.0, max_tokens=16, storm=64)
    load, storm = report["load"], report["disconnect_storm"]
    assert load["errors"] == 0, load["error_kinds"]
    assert load["ok"] >= 64                     # every client finished at least one full stream
    assert load["ttft_ms"]["p99"] is not None and load["itl_ms"]["p99"] is not None
    assert storm["hung_up_after_first_token"] == 64 and storm["failed_to_start"] == 0
    assert storm["running_after"] == 0
    assert engine.num_running() == 0
    assert len(engine.aborted) >= 64            # every departed client's engine request was aborted
    assert rt.admission is not None and rt.admission.in_flight == 0


@pytest.mark.redis
async def test_cli_report_names_the_box_and_exits_zero(tmp_path: Path, redis_url: str, prefix: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``nextguard bench load --url``: one JSON line last, with the machine's load next to the numbers."""
    import argparse
    import json

    from gateway.loadbench import add_arguments, main

    engine = ScriptedEngine(pieces=[f"w{i} " for i in range(8)], delay=0.002)
    app, _ = make_app(engine, tmp_path, redis_url=redis_url, prefix=prefix)
    p = argparse.ArgumentParser()
    add_arguments(p)
    async with serve_in_process(app) as base:
        args = p.parse_args(["--url", base, "--concurrency", "4", "--duration", "0.5", "--storm", "4",
                             "--max-tokens", "8", "--out", str(tmp_path / "report.json")])
        rc = await asyncio.to_thread(main, args)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and report["load"]["errors"] == 0 and report["disconnect_storm"]["running_after"] == 0
    assert report["server"] == {"spawned": False}
    assert report["box"]["before"]["cpus"] and len(report["box"]["after"]["loadavg_1_5_15"]) == 3
    assert json.loads((tmp_path / "report.json").read_text()) == report


def test_spawned_server_port_is_read_back_from_uvicorn(tmp_path: Path) -> None:
    """The bench starts the gateway with ``--port 0`` and reads the bound port from uvicorn's start-up line
    (a port picked beforehand could be taken by another process before the server binds it)."""
    import subprocess
    import sys

    import httpx

    from gateway.loadbench import _bound_port, _stop

    app_src = ("async def app(scope, receive, send):\n"
               "    if scope['type'] != 'http':\n        return\n"
               "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
               "    await send({'type': 'http.response.body', 'body': b'ok'})\n")
    (tmp_path / "tiny_app.py").write_text(app_src)
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tiny_app:app", "--host", "127.0.0.1", "--port", "0"],
                                cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            port = _bound_port(proc, log_path, timeout=30)
            assert port > 0 and httpx.get(f"http://127.0.0.1:{port}/", timeout=5).text == "ok"
        finally:
            _stop(proc)
    with open(log_path, "wb") as log:
        dead = subprocess.Popen([sys.executable, "-c", "print('no server here')"], stdout=log, stderr=subprocess.STDOUT)
        dead.wait(30)
    with pytest.raises(RuntimeError, match="before it bound a port"):
        _bound_port(dead, log_path, timeout=30)
