"""The compose deployment runs a batch to the end, as the tenant that submitted it.

No container runtime is assumed, so the services run as local processes, each with exactly what compose
gives it: the ``environment`` of its service in ``docker-compose.yml`` (anchors merged, ``${VAR}`` /
``${VAR:-default}`` / ``${VAR:?error}`` interpolated from a ``.env`` made from ``deploy/env.example`` with test
secrets), on top of the image's ``ENV`` from the ``Dockerfile``, and its ``command`` (the image's ``CMD`` where
the service has none). Compose's own readiness gates are used too: each service's ``healthcheck`` command
must pass before the next one starts. What a container would provide differently is replaced, and only that:

* service names (``redis``, ``gateway``) resolve to 127.0.0.1, and each service listens on a free port instead
  of its fixed one (Redis gets ``--port`` and ``--dir`` appended to its compose command);
* the ``nextguard-home`` volume (``/var/lib/nextguard``) is a temporary folder, into which the embedded model
  the image builds at build time is linked;
* ``PATH`` is this virtual environment's instead of the image's ``/app/.venv``.

The gateway is the real one (vLLM engine on the embedded model, the committed guard), so this is slow.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
VOLUME = "/var/lib/nextguard"          # the nextguard-home volume's mount point in both services



# -- what compose would compute -----------------------------------------------------------------------------
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ``$$`` is a literal ``$``; ``${V:-d}`` / ``${V-d}`` default when unset (or empty,
    with the colon); ``${V:?e}`` / ``${V?e}`` refuse to start."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in (":-", "-") and unset:
            return arg or ""
        if op in (":?", "?") and unset:
            raise ValueError(f"compose refuses to start: {name}: {arg}")
        return value or ""
    return _VAR.sub(sub, text)


def dotenv_from_example() -> dict[str, str]:
    """``cp deploy/env.example .env``, every value filled in (URL-safe, as the example asks)."""
    out = {}
    for line in (ROOT / "deploy" / "env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = value.strip() or secrets.token_hex(24)
    assert {"NEXTGUARD_REDIS_PASSWORD", "NEXTGUARD_ADMIN_KEY"} <= set(out)
    return out


def image() -> tuple[dict[str, str], list[str]]:
    """The final stage's ``ENV`` (with ``ARG`` defaults) and ``CMD`` of the Dockerfile."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    cmd: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("ARG ") and "=" in line:
            k, _, v = line[4:].partition("=")
            args[k.strip()] = v.strip()
        elif line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                k, _, v = item.partition("=")
                env[k] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), v)
        elif line.startswith("CMD "):
            cmd = json.loads(line[4:])
    return env, cmd


def service(name: str, dotenv: dict[str, str]) -> tuple[dict[str, str], list[str] | None, list[str]]:
    """A service's environment, command (None: the image's) and healthcheck test, as compose resolves them."""
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][name]
    env = {k: interpolate(str(v), dotenv) for k, v in (spec.get("environment") or {}).items()}
    cmd = [interpolate(str(c), dotenv) for c in spec["command"]] if "command" in spec else None
    check = [interpolate(str(c), dotenv) for c in spec["healthcheck"]["test"]]
    assert check[0] == "CMD", check
    return env, cmd, check[1:]


# -- running it here -----------------------------------------------------------------------------------------
class Local:
    """The stand-ins for what the containers would provide (see the module docstring)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.redis_port, self.gateway_port = free_port(), free_port()

    def rewrite(self, value: str) -> str:
        value = value.replace("@redis:6379", f"@127.0.0.1:{self.redis_port}")
        value = value.replace("http://gateway:8000", f"http://127.0.0.1:{self.gateway_port}")
        value = value.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{self.gateway_port}")
        return value.replace(VOLUME, str(self.home))

    def env(self, image_env: dict[str, str], service_env: dict[str, str]) -> dict[str, str]:
        merged = {**image_env, **service_env}      # compose's environment wins over the image's ENV
        merged["NEXTGUARD_SERVER__PORT"] = str(self.gateway_port)
        merged["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("NEXTGUARD_")}
        return {**base, **{k: self.rewrite(v) for k, v in merged.items()}}


def _healthy(check: list[str], env: dict[str, str], local: Local) -> bool:
    cmd = [sys.executable if c == "python" else c for c in (local.rewrite(c) for c in check)]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=15).returncode == 0


def _wait_healthy(proc: subprocess.Popen[bytes], check: list[str], env: dict[str, str], local: Local,
                  timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see its log in {local.home}")
        if _healthy(check, env, local):
            return
        time.sleep(2)
    raise TimeoutError(f"{what} not healthy within {timeout_s:g} s")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[dict[str, Any]]:
    from inference.embedded import ensure_embedded_model

    dotenv = dotenv_from_example()
    image_env, image_cmd = image()
    local = Local(tmp_path / "volume")
    local.home.mkdir()
    # the image converts the embedded model at build time into its NEXTGUARD_HOME
    (local.home / "models").symlink_to(ensure_embedded_model().parent, target_is_directory=True)
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        # redis: its compose command, listening where we can, with the password from .env
        r_env, r_cmd, r_check = service("redis", dotenv)
        assert r_cmd is not None and r_cmd[:2] == ["sh", "-c"]
        redis_env = {**os.environ, **r_env}
        script = f"{r_cmd[2]} --port {local.redis_port} --dir {shlex.quote(str(tmp_path))} --bind 127.0.0.1"
        redis = start(["sh", "-c", script], redis_env, "redis")
        assert r_check[0] == "redis-cli"
        _wait_healthy(redis, ["redis-cli", "-p", str(local.redis_port), *r_check[1:]], redis_env, local, 30, "redis")

        g_env_c, g_cmd, g_check = service("gateway", dotenv)
        g_env = local.env(image_env, g_env_c)
        gateway = start(g_cmd or image_cmd, g_env, "gateway")
        _wait_healthy(gateway, g_check, g_env, local, 600, "gateway")

        w_env_c, w_cmd, _ = service("worker", dotenv)
        assert w_cmd is not None
        w_env = local.env(image_env, w_env_c)
        start(w_cmd, w_env, "worker")
        yield {"base": f"http://127.0.0.1:{local.gateway_port}", "gateway_env": g_env, "home": local.home,
               "dotenv": dotenv, "logs": tmp_path}
    finally:
        for p in reversed(procs):          # compose stops dependents first
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _nextguard(env: dict[str, str], *argv: str) -> str:
    """``docker compose exec gateway nextguard ...``: the CLI with the gateway's environment."""
    exe = Path(sys.executable).with_name("nextguard")
    done = subprocess.run([str(exe), *argv], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_services_get_what_compose_gives_them() -> None:
    """The reading of the compose file the slow test relies on: required secrets refused when missing, the
    image's command and environment, and the worker pointed at the gateway with the operator key."""
    dotenv = dotenv_from_example()
    with pytest.raises(ValueError, match="NEXTGUARD_REDIS_PASSWORD"):
        service("gateway", {k: v for k, v in dotenv.items() if k != "NEXTGUARD_REDIS_PASSWORD"})
    image_env, cmd = image()
    assert cmd == ["nextguard", "serve"] and image_env["NEXTGUARD_OPS__AUTH__ENABLED"] == "true"
    g_env, g_cmd, g_check = service("gateway", dotenv)
    assert g_cmd is None and "/ready" in g_check[-1]
    assert g_env["NEXTGUARD_REDIS__URL"] == f"redis://:{dotenv['NEXTGUARD_REDIS_PASSWORD']}@redis:6379/0"
    assert g_env["NEXTGUARD_OPS__AUTH__ADMIN_KEY"] == dotenv["NEXTGUARD_ADMIN_KEY"]
    w_env, w_cmd, _ = service("worker", dotenv)
    assert w_cmd == ["nextguard", "worker", "--processes", "1"]
    assert w_env["NEXTGUARD_SUITES__API_KEY"] == dotenv["NEXTGUARD_ADMIN_KEY"]
    local = Local(Path("/nowhere"))
    env = local.env(image_env, w_env)
    assert env["NEXTGUARD_SUITES__API_BASE_URL"] == f"http://127.0.0.1:{local.gateway_port}/v1"
    assert env["NEXTGUARD_REDIS__URL"].endswith(f"@127.0.0.1:{local.redis_port}/0")
    assert env["NEXTGUARD_HOME"] == "/nowhere" and env["NEXTGUARD_OPS__AUDIT__PATH"] == "/nowhere/audit/audit.jsonl"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_compose_runs_a_batch_as_its_tenant(deployment: dict[str, Any]) -> None:
    base, g_env = deployment["base"], deployment["gateway_env"]
    created = json.loads(_nextguard(g_env, "keys", "--json", "create", "--tenant", "acme"))
    key = created["key"]
    acme = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    # keys are on: no key, no service
    assert httpx.post(f"{base}/v1/chat/completions", json={"model": "x", "messages": []}, timeout=10).status_code == 401
    # the scrape answers the internal network only, not the published port
    assert httpx.get(f"{base}/metrics", timeout=10).status_code == 404

    model = acme.get("/v1/models").json()["data"][0]["id"]
    questions = ["What is the capital of France?", "Name a primary colour.", "Say hello."]
    lines = "".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": model, "max_tokens": 12, "temperature": 0,
                                         "messages": [{"role": "user", "content": q}]}}) + "\n"
                    for i, q in enumerate(questions))
    f = acme.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", lines.encode())})
    assert f.status_code == 200, f.text
    b = acme.post("/v1/batches", json={"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions"})
    assert b.status_code == 200, b.text
    batch = b.json()
    deadline = time.monotonic() + 600
    while batch["status"] not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(2)
        batch = acme.get(f"/v1/batches/{batch['id']}").json()
    logs = deployment["logs"]
    assert batch["status"] == "completed", (batch, (logs / "worker.log").read_text()[-3000:])
    assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}, batch
    out = [json.loads(x) for x in acme.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == ["q0", "q1", "q2"]
    ids = set()
    for o in out:
        assert o["response"]["status_code"] == 200, o
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] in (
            "stop", "length", "content_filter"), body
        ids.add(body["id"])
    # every line was served to the worker (operator key) as tenant acme, through the guard: one audit line each
    audit_path = deployment["home"] / "audit" / "audit.jsonl"
    audit = [json.loads(x) for x in audit_path.read_text().splitlines()]
    served = [a for a in audit if a["route"] == "/v1/chat/completions"]
    assert {a["request_id"] for a in served} == ids, served
    assert {(a["tenant"], a["key_id"]) for a in served} == {("acme", "admin")}
    assert all(a["decision"] in ("pass", "intervened") for a in served), served
