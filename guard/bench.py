"""``nextguard bench guard``: what the monitor costs, measured in one run.

1. Per-token cost: the monitor's incremental step (layers 0..L with its KV cache, the K selected
   encoder columns, the scorer) against a full-depth incremental step of the same safeguard
   (all layers, final norm, LM head), batch 1, same slot-cache implementation; HF's own
   ``model(..., past_key_values)`` step is reported as a second reference.
2. Streaming throughput with N concurrent streams: a batched greedy generator (the base model,
   its own background loop and thread, outputs buffered per stream like vLLM's AsyncLLM) read
   directly (unguarded) or through :meth:`NextGuard.watch` (guarded, hold-back 1, the text re-tokenised
   as in serving), in the same run.

The generator here is an in-process transformers loop, not vLLM: it makes the ratio about the guard
alone on this machine. The JSON line printed last carries both ratios.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from guard.api import GuardPolicy, SafetyCut
from guard.bundle import MonitorSpec, load_model_for, read_manifest, resolve_base_model
from guard.config import GuardSettings
from guard.monitor import StreamScorer
from guard.text import response_context, user
from inference.types import TokenDelta

PROMPTS = (
    "Write a short story about a lighthouse keeper.", "Explain how vaccines work.",
    "Give me three tips for learning Python.", "Describe the water cycle.",
    "What is the history of the printing press?", "Write a poem about autumn leaves.",
    "How do I keep houseplants alive?", "Summarise the causes of the First World War.",
)


class _LMStep:
    """Slot runner over all layers + final norm + LM head; ``step`` returns the greedy next token."""

    def __init__(self, model: Any, max_slots: int) -> None:
        from guard.runner import SlotRunner

        self.r = SlotRunner(model, int(model.config.num_hidden_layers) - 1, max_slots=max_slots)
        self.norm = model.model.norm
        self.head = model.lm_head
        self.max_slots = max_slots

    def alloc(self) -> int:
        return self.r.alloc()

    def free(self, slot: int) -> None:
        self.r.free(slot)

    @property
    def n_active(self) -> int:
        return self.r.n_active

    def step(self, batch: Any) -> list[Any]:
        import torch

        outs = self.r.step(batch)
        last = torch.stack([o[-1] for o in outs])
        with torch.inference_mode():
            logits = self.head(self.norm(last.to(self.head.weight.dtype)))
        # one list per slot, like the residual rows GuardEngine slices per job
        return [[int(i)] for i in logits.argmax(-1)]


class BatchedGenerator:
    """Greedy generation for many streams, one batched step per iteration, in a background task."""

    def __init__(self, model: Any, tok: Any, max_slots: int = 16) -> None:
        from guard.batching import GuardEngine

        self.tok = tok
        self.lm = _LMStep(model, max_slots)
        self.engine = GuardEngine(self.lm, max_slots)

    async def generate(self, prompt_ids: list[int], max_tokens: int, rid: str) -> AsyncIterator[TokenDelta]:
        q: asyncio.Queue[TokenDelta | None] = asyncio.Queue()

        async def run() -> None:
            slot = await self.engine.acquire()
            try:
                nxt = (await self.engine.forward(slot, prompt_ids))[0]
                ids: list[int] = []
                text = ""
                for i in range(max_tokens):
                    ids.append(nxt)
                    full = self.tok.decode(ids)
                    d = TokenDelta(rid, 0, [nxt], full[len(text):],
                                   finish_reason="length" if i == max_tokens - 1 else None)
                    text = full
                    q.put_nowait(d)
                    if i < max_tokens - 1:
                        nxt = (await self.engine.forward(slot, [nxt]))[0]
            finally:
                await self.engine.release(slot)
                q.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            while True:
                d = await q.get()
                if d is None:
                    break
                yield d
            await task          # re-raise a generator failure instead of ending the stream quietly
        finally:
            if not task.done():
                task.cancel()

    async def close(self) -> None:
        await self.engine.close()


def _time_steps(fn: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def per_token_cost(model: Any, tok: Any, layer: int, spec: MonitorSpec, n_tokens: int = 128) -> dict[str, Any]:
    import torch

    from guard.runner import SlotRunner

    prompt = tok(response_context(user(PROMPTS[0])), add_special_tokens=False)["input_ids"]
    ids = tok(" Once upon a time, " * 40, add_special_tokens=False)["input_ids"][:n_tokens]
    mon = SlotRunner(model, layer, max_slots=1, init_len=1024)
    full = SlotRunner(model, int(model.config.num_hidden_layers) - 1, max_slots=1, init_len=1024)
    sc = StreamScorer(spec.scorer("response"))

    def run_monitor() -> float:
        s = mon.alloc()
        mon.step([(s, prompt)])
        t = time.perf_counter()
        for i in ids:
            r = mon.step([(s, [i])])[0]
            a = spec.encoder.encode(r).numpy()
            sc.step(a[0], float(r[0].norm()))
        dt = time.perf_counter() - t
        mon.free(s)
        return dt / len(ids)

    def run_full() -> float:
        s = full.alloc()
        full.step([(s, prompt)])
        t = time.perf_counter()
        for i in ids:
            r = full.step([(s, [i])])[0]
            with torch.inference_mode():
                model.lm_head(model.model.norm(r.to(model.lm_head.weight.dtype)))
        dt = time.perf_counter() - t
        full.free(s)
        return dt / len(ids)

    def run_hf() -> float:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            past = out.past_key_values
            t = time.perf_counter()
            for i in ids:
                out = model(input_ids=torch.tensor([[i]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            return (time.perf_counter() - t) / len(ids)

    run_monitor()
    run_full()          # warm-up
    # interleave repetitions so load from other processes hits both sides alike
    m, f, h = [], [], []
    for _ in range(3):
        m.append(run_monitor())
        f.append(run_full())
        h.append(run_hf())
    mon_s, full_s, hf_s = float(np.median(m)), float(np.median(f)), float(np.median(h))
    n_layers = int(model.config.num_hidden_layers)
    return {"monitor_ms_per_token": 1e3 * mon_s, "full_depth_ms_per_token": 1e3 * full_s,
            "hf_full_depth_ms_per_token": 1e3 * hf_s, "ratio": mon_s / full_s, "ratio_vs_hf": mon_s / hf_s,
            "layers_monitor": layer + 1, "layers_full": n_layers, "k_columns": len(spec.encoder.ids),
            "tokens": len(ids)}


async def _streams(gen: BatchedGenerator, tok: Any, n: int, max_tokens: int, guard: Any | None) -> dict[str, Any]:
    async def one(i: int) -> tuple[int, bool]:
        p = PROMPTS[i % len(PROMPTS)]
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        else:       # small test tokenizers have no chat template
            text = response_context(user(p)) + " "
        ids = tok(text, add_special_tokens=False)["input_ids"]
        src = gen.generate(list(ids), max_tokens, f"b{i}")
        # score every token with hold-back 1 but never cut, so guarded and unguarded streams have the
        # same length and the ratio measures the guard's cost, not its decisions
        it = guard.watch(user(p), src, GuardPolicy(hold_back=1, response_threshold=float("inf"))) if guard is not None else src
        n_tok, cut = 0, False
        async for d in it:
            if isinstance(d, SafetyCut):
                cut = True
                break
            n_tok += len(d.token_ids)
        return n_tok, cut

    t = time.perf_counter()
    res = await asyncio.gather(*[one(i) for i in range(n)])
    dt = time.perf_counter() - t
    tokens = sum(r[0] for r in res)
    return {"tokens": tokens, "seconds": dt, "tok_per_s": tokens / dt, "cuts": sum(r[1] for r in res)}


def run_bench(artifacts: str | Path, base_model: str | None = None, streams: int = 8, tokens: int = 64,
              monitored: str = "lora", out: str | Path | None = None, cost_tokens: int = 128,
              rounds: int = 3) -> dict[str, Any]:
    import torch

    from guard.runner import load_guard_model
    from guard.service import NextGuard

    torch.set_num_threads(1)
    artifacts = Path(artifacts)
    model, tok, layer = load_model_for(artifacts, monitored, base_model)
    spec = MonitorSpec.load(artifacts / "monitors" / monitored, monitored)
    cost = per_token_cost(model, tok, layer, spec, n_tokens=cost_tokens)

    man = read_manifest(artifacts)
    # the generator runs in the served engine's precision (vLLM's "auto" is the checkpoint's bf16 here)
    gen_model, gen_tok = load_guard_model(resolve_base_model(base_model or man["base_model"]), dtype=man.get("dtype", "float32"))

    async def main() -> dict[str, Any]:
        gen = BatchedGenerator(gen_model, gen_tok, max_slots=max(16, streams))
        settings = GuardSettings(enabled=True, artifacts_dir=artifacts, monitored=monitored,  # type: ignore[arg-type]
                                 max_batch=max(16, streams))
        guard = NextGuard(settings, model=model, tokenizer=tok, layer=layer, spec=spec).load()
        await _streams(gen, gen_tok, streams, 8, None)            # warm-up
        await _streams(gen, gen_tok, streams, 8, guard)
        runs: dict[str, list[dict[str, Any]]] = {"unguarded": [], "guarded": []}
        for _ in range(rounds):     # interleaved, so background load hits both alike
            runs["unguarded"].append(await _streams(gen, gen_tok, streams, tokens, None))
            runs["guarded"].append(await _streams(gen, gen_tok, streams, tokens, guard))
        steps = {"guard_steps": guard.engine.steps, "guard_rows": guard.engine.batched_rows}
        await gen.close()
        await guard.aclose()
        return {"rounds": runs, **steps}

    thr = asyncio.run(main())
    best = {k: max(r["tok_per_s"] for r in v) for k, v in thr["rounds"].items()}
    rr = thr["rounds"]

    def paired(variant: str) -> float:
        # median over rounds of guarded / unguarded *in the same round*: a burst of background load
        # slows one round of every variant, so per-round ratios are steadier than ratios of bests
        return float(np.median([g["tok_per_s"] / u["tok_per_s"] for g, u in zip(rr[variant], rr["unguarded"], strict=True)]))

    res = {
        "bench": "guard", "monitored": monitored, "streams": streams, "max_tokens": tokens,
        "per_token": cost,
        "throughput_tok_s": best,
        "throughput_ratio": paired("guarded"),
        "throughput_ratio_of_bests": best["guarded"] / best["unguarded"],
        "mean_streams_per_guard_step": thr["guard_rows"] / max(thr["guard_steps"], 1),
        "cost_ratio": cost["ratio"], "cost_target": 0.5, "throughput_target": 0.85,
        "rounds": thr["rounds"], "torch_threads": torch.get_num_threads(),
        "guard_policy": "hold_back=1, every token scored, threshold +inf (no cuts: equal stream lengths)",
        "generator": "in-process batched greedy transformers loop (SlotRunner, full depth), not vLLM",
    }
    if out is not None:
        Path(out).write_text(json.dumps(res, indent=1))
    return res
