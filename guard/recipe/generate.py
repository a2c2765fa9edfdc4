"""Answers written by the served model itself: the engine the gateway serves (vLLM, chat template,
production length), many requests in flight, results appended to a JSON-lines cache as they finish so a
long generation can be resumed.

A request may carry a *prefill*: text placed at the start of the assistant turn that the model continues
(a refusal opener, or a compliance opener on both sides of an intent minimal pair). The response is the
prefill plus the continuation, as a client would receive it from a model that wrote it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from guard.text import Conversation

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GenRequest:
    conv: Conversation
    prefill: str = ""
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)    # carried through to the result (label, group, ...)

    def key(self) -> str:
        return hashlib.sha1(json.dumps([self.conv, self.prefill, self.temperature, self.max_tokens, self.seed])
                            .encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class GenResult:
    request: GenRequest
    response: str
    n_tokens: int
    finish_reason: str | None


def _req_json(r: GenRequest) -> dict[str, Any]:
    d = asdict(r)
    d["conv"] = [list(t) for t in r.conv]
    return d


def _req_from(d: dict[str, Any]) -> GenRequest:
    return GenRequest(**{**d, "conv": tuple((a, b) for a, b in d["conv"])})


def load_results(path: Path) -> dict[str, GenResult]:
    out: dict[str, GenResult] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        req = _req_from(d["request"])
        out[req.key()] = GenResult(req, d["response"], d["n_tokens"], d.get("finish_reason"))
    return out


async def _run(engine: Any, reqs: Sequence[GenRequest], path: Path, concurrency: int) -> None:
    from inference.types import SamplingOptions

    sem = asyncio.Semaphore(concurrency)
    done = 0
    t0 = time.time()
    tokens = 0
    tok = engine.tokenizer

    async def one(i: int, r: GenRequest) -> None:
        nonlocal done, tokens
        async with sem:
            msgs = [{"role": "system" if role == "developer" else role, "content": c} for role, c in r.conv]
            ids = engine.apply_chat_template(msgs)
            if r.prefill:
                ids = ids + list(tok(r.prefill, add_special_tokens=False)["input_ids"])
            opts = SamplingOptions(max_tokens=r.max_tokens, temperature=r.temperature, top_p=0.95 if r.temperature else 1.0,
                                   seed=r.seed if r.temperature else None)
            text, n, fin = "", 0, None
            async for d in engine.generate(ids, opts, f"gen-{r.key()}-{i}"):
                text += d.text
                n += len(d.token_ids)
                fin = d.finish_reason or fin
            line = json.dumps({"request": _req_json(r), "response": r.prefill + text, "n_tokens": n, "finish_reason": fin})
            with open(path, "a") as f:
                f.write(line + "\n")
            done += 1
            tokens += n
            if done % 100 == 0:
                dt = time.time() - t0
                log.info("generated %d/%d (%.0f tok/s, %.0f s)", done, len(reqs), tokens / dt, dt)

    await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))


def _run_transformers(model_dir: str, reqs: Sequence[GenRequest], path: Path, batch: int) -> None:
    """The same requests through transformers' ``generate`` (small local models, tests): chat template when the
    tokenizer has one, else the guard's own conversation format as the prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from guard.text import response_context

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    groups: dict[float, list[GenRequest]] = {}
    for r in reqs:
        groups.setdefault(r.temperature, []).append(r)
    chunks = [g[i:i + batch] for g in groups.values() for i in range(0, len(g), batch)]
    for chunk in chunks:
        prompts = []
        for r in chunk:
            if getattr(tok, "chat_template", None):
                msgs = [{"role": "system" if role == "developer" else role, "content": c} for role, c in r.conv]
                text = str(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
            else:
                text = response_context(r.conv) + " "
            prompts.append(text + r.prefill)
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(chunk[0].seed)
        sampled = chunk[0].temperature > 0
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max(r.max_tokens for r in chunk), do_sample=sampled,
                                 temperature=chunk[0].temperature if sampled else None, top_p=0.95 if sampled else None,
                                 pad_token_id=tok.pad_token_id)
        with open(path, "a") as f:
            for r, row in zip(chunk, out[:, enc["input_ids"].shape[1]:], strict=True):
                ids = [int(t) for t in row[: r.max_tokens] if int(t) != tok.pad_token_id]
                text = str(tok.decode(ids, skip_special_tokens=True))
                f.write(json.dumps({"request": _req_json(r), "response": r.prefill + text, "n_tokens": len(ids),
                                    "finish_reason": "length" if len(ids) >= r.max_tokens else "stop"}) + "\n")


def generate(reqs: Sequence[GenRequest], cache: Path, *, concurrency: int = 48, max_model_len: int = 2048,
             model: str | None = None, threads_bind: str | None = None, backend: str = "vllm") -> dict[str, GenResult]:
    """Answer every request not yet in ``cache`` with the served model; returns all results by request key.

    ``backend="vllm"`` runs the engine the gateway serves; ``"transformers"`` runs ``model`` (a local folder)
    through transformers (small models). ``threads_bind`` (vLLM's CPU core list) defaults to every core: an
    offline build has the machine to itself, whereas serving keeps a core for the scheduler and the guard."""
    if backend not in ("vllm", "transformers"):
        raise ValueError(f"Unknown generation backend '{backend}'. Available: vllm, transformers")
    cache.parent.mkdir(parents=True, exist_ok=True)
    have = load_results(cache)
    todo = list({r.key(): r for r in reqs if r.key() not in have}.values())
    if todo and backend == "transformers":
        if model is None:
            raise ValueError("the transformers backend needs a local model folder")
        _run_transformers(model, todo, cache, batch=max(1, min(concurrency, 16)))
        have = load_results(cache)
    elif todo:
        log.info("generating %d answers (%d cached)", len(todo), len(have))
        import os

        from inference.config import InferenceSettings
        from inference.vllm_engine import VLLMEngineClient

        bind = threads_bind or f"0-{(os.cpu_count() or 1) - 1}"
        engine = VLLMEngineClient.from_settings(InferenceSettings(
            model=model, max_model_len=max_model_len, max_num_seqs=max(concurrency, 16), kv_cache_gib=4,
            cpu_threads_bind=bind))
        try:
            asyncio.run(_run(engine, todo, cache, concurrency))
        finally:
            asyncio.run(engine.shutdown())
        have = load_results(cache)
    return have
