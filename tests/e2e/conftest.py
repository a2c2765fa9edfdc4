from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """`nextguard serve` in a subprocess on the embedded model: the contract README command 1 promises."""
    port = free_port()
    exe = Path(sys.executable).with_name("nextguard")
    cmd = [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "NEXTGUARD_INFERENCE__MAX_MODEL_LEN": "1024", "NEXTGUARD_REDIS__EMBEDDED": "false"}
    log = open(ROOT / "tests" / ".e2e-server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see tests/.e2e-server.log")
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise TimeoutError("server not ready in 600 s")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
