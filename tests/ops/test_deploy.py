"""The deployment files: compose structure (and `docker compose config` when a compose binary exists), the
Prometheus scrape config, the Grafana provisioning, and a dashboard that only queries metrics we export."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import metrics

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "nextguard.json"


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # type: ignore[no-any-return]


def test_compose_structure() -> None:
    c = compose()
    services = c["services"]
    assert {"redis", "gateway", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no healthcheck"
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services and cond == {"condition": "service_healthy"}, (name, dep)
    # default deployment: keys required, one Redis for everyone, drain window honoured by the stop timeout
    gw = services["gateway"]
    env = gw["environment"]
    assert env["NEXTGUARD_OPS__AUTH__ENABLED"] == "true"
    # one Redis, with the password from .env (required: compose refuses to start without it)
    assert re.fullmatch(r"redis://:\$\{NEXTGUARD_REDIS_PASSWORD:\?[^}]*\}@redis:6379/0", env["NEXTGUARD_REDIS__URL"])
    assert gw["stop_signal"] == "SIGTERM" and int(gw["stop_grace_period"].rstrip("s")) > 30
    # vLLM's engine needs a 160 MiB ring buffer in /dev/shm (64 MiB in a container unless raised)
    for name in ("gateway", "gateway-b"):
        size = services[name]["shm_size"]
        assert size.endswith("gb") and int(size[:-2]) >= 1, (name, size)
    # grafana gets the datasource, the dashboard provider and the dashboards mounted from the repo
    for vol in services["grafana"]["volumes"]:
        src = vol.split(":")[0]
        assert (ROOT / src).exists(), src


def test_compose_scale_profile() -> None:
    services = compose()["services"]
    scale = {n for n, s in services.items() if "scale" in (s.get("profiles") or [])}
    assert scale == {"gateway-b", "lb", "worker"}
    a, b = services["gateway"], services["gateway-b"]
    assert a["environment"] == b["environment"]          # same Redis, same auth: keys and quotas are shared
    assert a["image"] == b["image"]
    assert "ports" not in b                               # reached through the load balancer only
    assert services["worker"]["command"][:2] == ["nextguard", "worker"]
    conf = (ROOT / "deploy" / "nginx" / "nextguard-lb.conf").read_text()
    assert "server gateway:8000" in conf and "server gateway-b:8000" in conf
    assert "proxy_buffering off" in conf                  # SSE must not be buffered by the proxy
    lb_src = services["lb"]["volumes"][0].split(":")[0]
    assert (ROOT / lb_src).is_file()


def test_prometheus_scrapes_every_replica() -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    names = job["dns_sd_configs"][0]["names"]
    assert job["dns_sd_configs"][0]["port"] == 8000
    # each name is a replica's alias on the internal network alone (a service name resolves to its edge
    # address, which /metrics refuses), and the replica label is that service's name
    services = compose()["services"]
    aliases = {svc: services[svc]["networks"]["internal"]["aliases"] for svc in ("gateway", "gateway-b")}
    assert {svc: [f"{svc}-metrics"] for svc in aliases} == aliases and set(names) == {f"{s}-metrics" for s in aliases}
    assert all(services[svc]["networks"]["edge"] in ({}, None) for svc in aliases)
    (relabel,) = job["relabel_configs"]
    assert relabel["target_label"] == "replica"
    assert re.sub(f"^(?:{relabel['regex']})$", "\\1", "gateway-b-metrics") == "gateway-b"   # Prometheus anchors it


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="no docker-compose binary on this machine")
def test_docker_compose_config_validates() -> None:
    for args in ([], ["--profile", "scale"]):
        secrets = {"NEXTGUARD_REDIS_PASSWORD": "x" * 24, "GRAFANA_ADMIN_PASSWORD": "y" * 24}
        r = subprocess.run(["docker-compose", *args, "config", "-q"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, env={**os.environ, **secrets})
        assert r.returncode == 0, r.stderr


def _exported_names() -> set[str]:
    names: set[str] = set()
    for collector in list(metrics.REGISTRY._collector_to_names):  # every family the gateway registers
        for fam in collector.collect():
            if fam.name.startswith("gateway_"):
                # families without samples yet (no label set observed) still have fixed sample names
                suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
                names.update(fam.name + suf for suf in suffixes.get(fam.type, ("",)))
    return names


def test_dashboard_loads_and_queries_only_real_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "nextguard-overview" and dash["panels"]
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    ds_uid = ds["datasources"][0]["uid"]
    exported = _exported_names()
    wanted = {"gateway_guard_step_seconds_bucket", "gateway_guard_held_back_tokens_bucket", "gateway_shed_total",
              "gateway_queue_depth", "gateway_guard_failures_total", "gateway_guard_decisions_total",
              "gateway_cut_position_tokens_bucket", "gateway_time_to_first_token_seconds_bucket"}
    used: set[str] = set()
    ids = set()
    for p in dash["panels"]:
        assert p["id"] not in ids
        ids.add(p["id"])
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == ds_uid
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            for name in re.findall(r"\b(gateway_[a-z_]+)", t["expr"]):
                assert name in exported, f"panel {p['title']!r} queries {name}, which the gateway does not export"
                used.add(name)
    assert wanted <= used, wanted - used
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/nextguard.yml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_compose_file_names_the_public_images_by_default() -> None:
    """The local stand-ins are opt-in: without the variables compose pulls the public images."""
    text = COMPOSE.read_text()
    for var, public in (("NEXTGUARD_REDIS_IMAGE", "redis:7-alpine"), ("NEXTGUARD_NGINX_IMAGE", "nginx:1.27-alpine"),
                        ("NEXTGUARD_PROMETHEUS_IMAGE", "prom/prometheus:v3.1.0"),
                        ("NEXTGUARD_PYTHON_IMAGE", "python:3.11-slim-bookworm")):
        assert re.search(r"\$\{" + var + ":-" + re.escape(public) + r"\}", text), var
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in (ROOT / "Dockerfile").read_text()
