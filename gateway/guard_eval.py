"""The everyday section of ``nextguard guard eval``: what a user of the default deployment sees.

A real gateway (``nextguard serve``, the embedded model, the guard with its default policy) is started on a
free port; every held-out everyday prompt is sent to ``/v1/moderations`` and streamed through
``/v1/chat/completions`` at production length, greedy, as an OpenAI client would. Reported: the share of
prompts the moderation endpoint flags, of streams refused (HTTP 400 ``content_filter``) and of streams cut
(``finish_reason: "content_filter"``), where the cuts happened, and the examples.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from gateway.bench import _free_port, _stop  # the same server lifecycle as `nextguard bench serve`


async def _stream(client: httpx.AsyncClient, base: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    out: dict[str, Any] = {"prompt": prompt, "text": "", "tokens": 0, "outcome": "passed"}
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            err = json.loads(await r.aread()).get("error", {})
            out["outcome"] = "refused" if err.get("code") == "content_filter" else f"error {r.status_code}"
            out["safety"] = err.get("safety")
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out["outcome"] = "error"
                return out
            for c in chunk.get("choices", []):
                out["text"] += (c.get("delta") or {}).get("content") or ""
                if c.get("finish_reason") == "content_filter":
                    out["outcome"] = "cut"
                    out["safety"] = c.get("safety")
                    out["cut_at_char"] = len(out["text"])
            if chunk.get("usage"):
                out["tokens"] = chunk["usage"]["completion_tokens"]
    return out


async def _run(base: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=900) as client:
        model = (await client.get(base + "/v1/models")).json()["data"][0]["id"]
        flagged: list[bool] = []
        for i in range(0, len(prompts), 32):
            r = await client.post(base + "/v1/moderations", json={"input": prompts[i:i + 32]})
            r.raise_for_status()
            flagged += [x["flagged"] for x in r.json()["results"]]
        sem = asyncio.Semaphore(concurrency)

        async def one(p: str) -> dict[str, Any]:
            async with sem:
                return await _stream(client, base, model, p, max_tokens)

        t0 = time.perf_counter()
        streams = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - t0
    n = len(prompts)
    outcomes = [s["outcome"] for s in streams]
    cuts = [s for s in streams if s["outcome"] == "cut"]
    return {
        "n_prompts": n, "max_tokens": max_tokens,
        "moderation_flagged": sum(flagged) / max(n, 1),
        "streams_refused": outcomes.count("refused") / max(n, 1),
        "streams_cut": outcomes.count("cut") / max(n, 1),
        "streams_errors": sum(o.startswith("error") for o in outcomes),
        "cut_positions_chars": [c["cut_at_char"] for c in cuts],
        "answer_chars_mean": sum(len(s["text"]) for s in streams) / max(n, 1),
        "wall_s": wall,
        "flagged_by_moderation": [p for p, f in zip(prompts, flagged, strict=True) if f],
        "refused": [{"prompt": s["prompt"], "safety": s.get("safety")} for s in streams if s["outcome"] == "refused"],
        "cut": [{"prompt": c["prompt"], "released": c["text"][-200:], "safety": c.get("safety")} for c in cuts],
    }


def everyday_section(artifacts: str, prompts: list[str], *, max_tokens: int = 512, concurrency: int = 8,
                     log_dir: Path | None = None) -> dict[str, Any]:
    """Start ``nextguard serve`` with the given guard artifacts and the default policy, run the everyday prompts."""
    port = _free_port()
    env = {**os.environ, "NEXTGUARD_GUARD__ARTIFACTS_DIR": str(artifacts), "NEXTGUARD_GUARD__ENABLED": "true",
           "NEXTGUARD_REDIS__EMBEDDED": os.environ.get("NEXTGUARD_REDIS__EMBEDDED", "true")}
    cmd = [str(Path(sys.executable).with_name("nextguard")), "serve", "--host", "127.0.0.1", "--port", str(port)]
    log_path = (log_dir or Path(".")) / "everyday-gateway.log"
    base = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        f = stack.enter_context(open(log_path, "wb"))
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        stack.callback(_stop, p)
        deadline = time.monotonic() + 900
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"the gateway exited with code {p.returncode}; see {log_path}")
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway was not ready in 900 s; see {log_path}")
            time.sleep(1)
        return asyncio.run(_run(base, prompts, max_tokens, concurrency))


def eval_extension(args: Any, report: dict[str, Any]) -> dict[str, Any]:
    """Hook for ``nextguard guard eval`` (registered by :mod:`gateway.cli`): the everyday section."""
    if getattr(args, "no_gateway", False):
        return {}
    from guard.eval_data import load_eval_prompts

    prompts = [t for _, t in load_eval_prompts("everyday")]
    if args.limit:
        prompts = prompts[: max(args.limit, 8)]
    out = Path(args.out)
    res = everyday_section(args.artifacts, prompts, max_tokens=args.everyday_max_tokens, log_dir=out)
    return {"everyday_gateway": res}
