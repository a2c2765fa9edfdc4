"""``nextguard bench load``: the reliability run, on loopback, bounded in time.

1. **Load**: ``--concurrency`` clients (default 64) each stream chat completions back to back for
   ``--duration`` seconds. A request counts as an error unless it is HTTP 200, every frame parses, no
   in-stream error frame arrives, and the stream ends with ``[DONE]``; the guard's own decisions are
   counted apart, never as errors (a prompt refused with 400 ``content_filter``, a choice cut with
   ``finish_reason: content_filter``). Reports p50/p90/p99 of TTFT (to the first *content* token),
   inter-token latency and end-to-end time, plus throughput.
2. **Disconnect storm**: ``--storm`` clients open a stream each, read until their first content token and
   hang up. Then ``/metrics`` is polled until ``gateway_engine_requests_running`` is back to 0; the time
   that takes is reported (the engine must free every slot the departed clients held).

Without ``--url`` a gateway (``nextguard serve``, the embedded model unless configured otherwise) is
started on a free loopback port and stopped afterwards. The last stdout line is one JSON report; the exit
code is 0 only with 0 errors and the running count back to 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works.",
    "List five facts about the moon.",
    "Describe a walk through a forest in autumn.",
)
_RUNNING = re.compile(rb"^gateway_engine_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]); None when there is no sample."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


@dataclass
class LoadStats:
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    cuts: int = 0            # choices the guard ended with finish_reason=content_filter (not errors)
    refusals: int = 0        # prompts the guard refused (400 content_filter): a decision, not an error
    wall: float = 0.0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())

    def summary(self) -> dict[str, Any]:
        def ms(x: float | None) -> float | None:
            return None if x is None else round(1000 * x, 2)

        return {
            "requests": self.ok + self.refusals + self.n_errors,
            "ok": self.ok,
            "errors": self.n_errors,
            "error_kinds": dict(self.errors),
            "wall_s": round(self.wall, 2),
            "requests_per_s": round(self.ok / self.wall, 2) if self.wall else 0.0,
            "content_chunks": self.tokens,
            "chunks_per_s": round(self.tokens / self.wall, 1) if self.wall else 0.0,
            "guard_cuts": self.cuts,
            "guard_prompt_refusals": self.refusals,
            "ttft_ms": {"p50": ms(pct(self.ttft, 0.5)), "p90": ms(pct(self.ttft, 0.9)), "p99": ms(pct(self.ttft, 0.99))},
            "itl_ms": {"p50": ms(pct(self.itl, 0.5)), "p90": ms(pct(self.itl, 0.9)), "p99": ms(pct(self.itl, 0.99))},
            "e2e_ms": {"p50": ms(pct(self.e2e, 0.5)), "p90": ms(pct(self.e2e, 0.9)), "p99": ms(pct(self.e2e, 0.99))},
        }


def _body(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "stream": True,
    }


def _is_refusal(r: httpx.Response) -> bool:
    """The prompt gate said no (HTTP 400, ``code: content_filter``): the guard working, not a failure."""
    if r.status_code != 400:
        return False
    try:
        return bool(r.json()["error"]["code"] == "content_filter")
    except (ValueError, KeyError, TypeError):
        return False


async def one_stream(client: httpx.AsyncClient, model: str, i: int, max_tokens: int, stats: LoadStats) -> None:
    t0 = time.perf_counter()
    first: float | None = None
    last: float | None = None
    done = False
    try:
        async with client.stream("POST", "/v1/chat/completions", json=_body(model, i, max_tokens)) as r:
            if r.status_code != 200:
                await r.aread()
                if _is_refusal(r):
                    stats.refusals += 1
                else:
                    stats.error(f"http_{r.status_code}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    done = True
                    break
                obj = json.loads(payload)
                if "error" in obj:
                    stats.error("error_frame:" + str(obj["error"].get("code")))
                    return
                if any(c.get("finish_reason") == "content_filter" for c in obj.get("choices", [])):
                    stats.cuts += 1
                if any((c.get("delta") or {}).get("content") for c in obj.get("choices", [])):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                        stats.ttft.append(now - t0)
                    elif last is not None:
                        stats.itl.append(now - last)
                    last = now
                    stats.tokens += 1
    except (httpx.HTTPError, ValueError) as e:
        stats.error(type(e).__name__)
        return
    if not done:
        stats.error("no_done")
        return
    stats.ok += 1
    stats.e2e.append(time.perf_counter() - t0)


async def run_load(client: httpx.AsyncClient, model: str, concurrency: int, duration_s: float, max_tokens: int) -> LoadStats:
    """``concurrency`` clients stream back to back until ``duration_s`` has passed (started ones finish)."""
    stats = LoadStats()
    stop_at = time.perf_counter() + duration_s
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            await one_stream(client, model, next(counter), max_tokens, stats)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.wall = time.perf_counter() - t0
    return stats


async def running_count(client: httpx.AsyncClient) -> float | None:
    r = await client.get("/metrics")
    m = _RUNNING.search(r.content)
    return float(m.group(1)) if m else None


async def disconnect_storm(client: httpx.AsyncClient, model: str, n: int, max_tokens: int,
                           settle_timeout_s: float = 60.0) -> dict[str, Any]:
    """``n`` clients hang up after their first content token; wait until the engine holds no request."""
    hung_up = 0
    failed = 0
    refused = 0

    async def leaver(i: int) -> None:
        nonlocal hung_up, failed, refused
        try:
            async with client.stream("POST", "/v1/chat/completions", json=_body(model, 10_000 + i, max_tokens)) as r:
                if r.status_code != 200:
                    await r.aread()
                    if _is_refusal(r):
                        refused += 1
                    else:
                        failed += 1
                    return
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                        hung_up += 1
                        return          # leaving the block closes the connection mid-stream
        except httpx.HTTPError:
            failed += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(leaver(i) for i in range(n)))
    t_left = time.perf_counter()
    peak = 0.0
    running: float | None = None
    while time.perf_counter() - t_left < settle_timeout_s:
        running = await running_count(client)
        if running is None:
            break
        peak = max(peak, running)
        if running == 0:
            break
        await asyncio.sleep(0.05)
    return {
        "clients": n,
        "hung_up_after_first_token": hung_up,
        "failed_to_start": failed,
        "refused_by_guard": refused,
        "storm_s": round(t_left - t0, 3),
        "running_after": running,
        "running_peak_seen": peak,
        "seconds_to_zero": round(time.perf_counter() - t_left, 3) if running == 0 else None,
    }


async def bench(base_url: str, *, model: str | None, api_key: str | None, concurrency: int, duration_s: float,
                max_tokens: int, storm: int, warmup: int = 2) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + storm + 8, max_keepalive_connections=concurrency + 8)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=timeout) as client:
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        if warmup:
            # the first requests pay one-time costs (compilation, caches): keep them out of the numbers
            await asyncio.gather(*(one_stream(client, model, i, 4, LoadStats()) for i in range(warmup)))
        load = await run_load(client, model, concurrency, duration_s, max_tokens)
        storm_report = await disconnect_storm(client, model, storm, max(64, max_tokens)) if storm else None
    return {
        "url": base_url,
        "model": model,
        "concurrency": concurrency,
        "duration_s": duration_s,
        "max_tokens": max_tokens,
        "load": load.summary(),
        "disconnect_storm": storm_report,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="a running gateway; default: start `nextguard serve` on loopback")
    p.add_argument("--api-key", default=os.environ.get("NEXTGUARD_API_KEY"))
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load (started requests finish)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--storm", type=int, default=64, help="clients in the disconnect storm (0 = skip)")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--out", default=None, help="also write the JSON report here")
    p.add_argument("--guard", choices=["default", "on", "off"], default="default",
                   help="the spawned gateway's guard: as configured (default), forced on, or off (ignored with --url)")


_BOUND = re.compile(rb"Uvicorn running on https?://[^:/\s]+:(\d+)")


def _bound_port(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> int:
    """The port a server started with ``--port 0`` bound, read from uvicorn's start-up line.

    The server binds a port the OS picks at that moment. Choosing a free port here and passing it on
    would leave a window (seconds of imports on a loaded machine) in which another process can take it,
    and the server then dies with "address already in use"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = _BOUND.search(log_path.read_bytes())
        except OSError:
            m = None
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with code {proc.returncode} before it bound a port; the end of "
                               f"{log_path}:\n{_log_tail(log_path)}")
        time.sleep(0.2)
    raise TimeoutError(f"the gateway did not bind a port within {timeout:.0f} s; the end of {log_path}:\n"
                       f"{_log_tail(log_path)}")


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with code {proc.returncode} before it was ready; the end of "
                               f"{log_path}:\n{_log_tail(log_path)}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s; the end of {log_path}:\n{_log_tail(log_path)}")


def _box() -> dict[str, Any]:
    """What else the machine was doing: the numbers mean little without it."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in load]}


def main(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)     # one line per request would bury the report
    box_before = _box()
    server: dict[str, Any] = {"spawned": args.url is None}
    with ExitStack() as stack:
        url = args.url
        if url is None:
            home = Path(os.environ.get("NEXTGUARD_HOME", Path.home() / ".cache" / "nextguard"))
            (home / "bench").mkdir(parents=True, exist_ok=True)
            log_path = home / "bench" / "load-gateway.log"
            log = stack.enter_context(open(log_path, "wb"))
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
            env = dict(os.environ)
            if args.guard != "default":
                env["NEXTGUARD_GUARD__ENABLED"] = "true" if args.guard == "on" else "false"
            server.update(guard=args.guard, log=str(log_path))
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            stack.callback(_stop, proc)
            url = f"http://127.0.0.1:{_bound_port(proc, log_path, args.ready_timeout)}"
            _wait_ready(url, proc, args.ready_timeout, log_path)
        report = asyncio.run(
            bench(url, model=args.model, api_key=args.api_key, concurrency=args.concurrency, duration_s=args.duration,
                  max_tokens=args.max_tokens, storm=args.storm)
        )
    report["server"] = server
    report["box"] = {"before": box_before, "after": _box()}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    sys.stdout.write(json.dumps(report) + "\n")
    storm = report["disconnect_storm"]
    ok = report["load"]["errors"] == 0 and (storm is None or storm["running_after"] == 0)
    return 0 if ok else 1


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
