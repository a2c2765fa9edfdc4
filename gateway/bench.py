"""``nextguard bench serve``: N concurrent streaming clients against the gateway and, in the same run,
against vLLM's own OpenAI server on the same model and engine arguments. Rounds alternate between the
two servers (ABAB…) so machine drift hits both alike. The last line printed is one JSON object with the
ratios (gateway / vLLM)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.config import Settings
from inference.hardware import engine_dtype
from inference.vllm_engine import resolve_model


@dataclass
class RunStats:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    # per stream (last content - first content) / (tokens - 1): time per output token, which stays comparable
    # when a server sends several tokens in one chunk
    tpot: list[float] = field(default_factory=list)
    tokens: int = 0               # completion tokens delivered (the usage chunk's count; chunks where absent)
    chunks: int = 0               # content deltas received (the guard's hold-back may merge tokens into one)
    wall: float = 0.0
    errors: int = 0
    # every stream that ended before max_tokens: why (finish_reason, the guard's safety object) and where
    short: list[dict[str, Any]] = field(default_factory=list)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def _one(
    client: httpx.AsyncClient, url: str, model: str, max_tokens: int, stats: RunStats, i: int, guard: bool, tag: str,
    system: str | None = None,
) -> None:
    messages = [{"role": "user", "content": f"Write a short story about a lighthouse keeper, number {i}."}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if not guard and tag == "gateway":   # guard off for the ratio the issue targets; vLLM knows no guard
        body["guard"] = {"enabled": False}
    t0 = time.perf_counter()
    last = None
    n_chunks = 0
    usage_tokens: int | None = None
    finish: str | None = None
    safety: Any = None
    stats_first: float | None = None
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                stats.errors += 1
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    stats.errors += 1
                    return
                if chunk.get("usage"):
                    usage_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                for c in chunk.get("choices", []):
                    if c.get("finish_reason"):
                        finish = c["finish_reason"]
                        safety = c.get("safety")
                    content = (c.get("delta") or {}).get("content")
                    if not content:
                        continue
                    now = time.perf_counter()
                    if last is None:
                        stats.ttft.append(now - t0)
                        stats_first = now
                    else:
                        stats.itl.append(now - last)
                    last = now
                    n_chunks += 1
    except httpx.HTTPError:
        stats.errors += 1
        return
    delivered = usage_tokens if usage_tokens is not None else n_chunks
    stats.tokens += delivered
    if stats_first is not None and last is not None and delivered > 1:
        stats.tpot.append((last - stats_first) / (delivered - 1))
    stats.chunks += n_chunks
    if delivered < max_tokens:
        stats.short.append({"request": i, "server": tag, "tokens": delivered, "chunks": n_chunks,
                            "finish_reason": finish, "safety": safety})


async def _round(base: str, model: str, n_requests: int, concurrency: int, max_tokens: int, guard: bool, tag: str,
                 system: str | None = None) -> RunStats:
    stats = RunStats()
    sem = asyncio.Semaphore(concurrency)
    url = base + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=600) as client:
        async def task(i: int) -> None:
            async with sem:
                await _one(client, url, model, max_tokens, stats, i, guard, tag, system)

        t0 = time.perf_counter()
        await asyncio.gather(*(task(i) for i in range(n_requests)))
        stats.wall = time.perf_counter() - t0
    return stats


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(url)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _summ(s: RunStats) -> dict[str, float]:
    return {
        "ttft_p50_ms": 1000 * _pct(s.ttft, 0.5),
        "ttft_p99_ms": 1000 * _pct(s.ttft, 0.99),
        "itl_mean_ms": 1000 * (statistics.fmean(s.itl) if s.itl else float("nan")),
        "itl_p99_ms": 1000 * _pct(s.itl, 0.99),
        "tpot_mean_ms": 1000 * (statistics.fmean(s.tpot) if s.tpot else float("nan")),
        "tokens_per_s": s.tokens / s.wall if s.wall else 0.0,
        "tokens": s.tokens,
        "chunks": s.chunks,
        "errors": s.errors,
        "streams_ended_early": len(s.short),
    }


def _merge(rs: list[RunStats]) -> RunStats:
    out = RunStats()
    for r in rs:
        out.ttft += r.ttft
        out.itl += r.itl
        out.tpot += r.tpot
        out.tokens += r.tokens
        out.chunks += r.chunks
        out.wall += r.wall
        out.errors += r.errors
        out.short += r.short
    return out


def main(args: argparse.Namespace) -> int:
    if args.model is not None:
        os.environ["NEXTGUARD_INFERENCE__MODEL"] = args.model
    if args.guard == "off":
        os.environ["NEXTGUARD_GUARD__ENABLED"] = "false"
    settings = Settings()
    source, name = resolve_model(settings.inference)
    inf = settings.inference
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": f"{inf.kv_cache_gib:g}",
        "NEXTGUARD_REDIS__EMBEDDED": "false",
        # guard off = the monitor is not even loaded, so the ratio isolates the gateway's own overhead
        "NEXTGUARD_GUARD__ENABLED": "true" if args.guard == "on" else "false",
    }
    vport, gport = _free_port(), _free_port()
    logs = Path(settings.home) / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    vllm_cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", source, "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(vport), "--max-model-len", str(inf.max_model_len),
        "--max-num-seqs", str(inf.max_num_seqs), "--seed", str(inf.seed), "--dtype", engine_dtype(inf.dtype),
        "--disable-uvicorn-access-log",
    ] + (["--enforce-eager"] if inf.enforce_eager else [])
    gw_cmd = [str(Path(sys.executable).with_name("nextguard")), "serve", "--host", "127.0.0.1", "--port", str(gport)]
    with ExitStack() as stack:
        procs = []
        for cmd, log in ((vllm_cmd, "vllm.log"), (gw_cmd, "gateway.log")):
            f = stack.enter_context(open(logs / log, "wb"))
            p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
            procs.append(p)
            stack.callback(_stop, p)
        vbase, gbase = f"http://127.0.0.1:{vport}", f"http://127.0.0.1:{gport}"
        _wait_ready(vbase + "/health", procs[0])
        _wait_ready(gbase + "/ready", procs[1])
        guard = args.guard == "on"
        # warm-up both (first requests pay one-time costs)
        for base, tag in ((vbase, "vllm"), (gbase, "gateway")):
            asyncio.run(_round(base, name, args.concurrency, args.concurrency, 8, guard, tag, args.system))
        rounds = max(2, args.rounds)
        per = max(1, args.requests // rounds)
        v_runs, g_runs = [], []
        for _ in range(rounds):
            v_runs.append(asyncio.run(_round(vbase, name, per, args.concurrency, args.max_tokens, guard, "vllm",
                                             args.system)))
            g_runs.append(asyncio.run(_round(gbase, name, per, args.concurrency, args.max_tokens, guard, "gateway",
                                             args.system)))
    vm, gm = _merge(v_runs), _merge(g_runs)
    v, g = _summ(vm), _summ(gm)
    report = {
        "model": name,
        "concurrency": args.concurrency,
        "requests_per_server": per * rounds,
        "max_tokens": args.max_tokens,
        "guard": args.guard,
        "system": args.system,
        "vllm": v,
        "gateway": g,
        "tokens_per_s_ratio": g["tokens_per_s"] / v["tokens_per_s"] if v["tokens_per_s"] else None,
        "ttft_p50_overhead_ms": g["ttft_p50_ms"] - v["ttft_p50_ms"],
        "ttft_p99_overhead_ms": g["ttft_p99_ms"] - v["ttft_p99_ms"],
        "itl_mean_ratio": g["itl_mean_ms"] / v["itl_mean_ms"] if v["itl_mean_ms"] else None,
        "tpot_mean_ratio": g["tpot_mean_ms"] / v["tpot_mean_ms"] if v["tpot_mean_ms"] else None,
        "tokens_expected_per_server": per * rounds * args.max_tokens,
        "short_streams": {"vllm": vm.short, "gateway": gm.short},
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0 if g["errors"] == 0 and v["errors"] == 0 else 1


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
