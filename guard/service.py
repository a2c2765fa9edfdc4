"""The streaming runtime: :class:`NextGuard` implements :class:`guard.api.StreamGuard`.

Shape::

    watch(stream A) ─┐                        ┌─> rows for A -> SelectedEncoder (K columns) -> StreamScorer
    watch(stream B) ─┼─> GuardEngine queue ──>│   one SlotRunner.step for every stream with pending tokens
    check_prompt    ─┘   (asyncio task)       └─> rows for B ...      (layers <= L only, own KV slots)

* One forward per engine step for all active streams; the step runs in a single worker thread so the
  event loop (and the generator) keep running while torch computes.
* Hold-back: a generator delta is yielded only when the guard has scored every guard token that covers
  its characters, plus ``hold_back - 1`` further guard tokens. On a cut the pending deltas are
  dropped and a :class:`SafetyCut` is yielded last, so the offending token never leaves.
* Tokenizers: generator and guard may differ, so by default the generated *text* is re-tokenised
  with the guard tokenizer incrementally (:class:`IncrementalRetokenizer`). When the gateway
  declares the same tokenizer (:meth:`NextGuard.set_generator_tokenizer`), the ids are used directly.
* Errors inside the guard: fail closed (a ``guard_error`` cut) unless the policy says fail open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from guard.api import FeatureActivation, GuardPolicy, SafetyCut, report_fail_open
from guard.bundle import MonitorSpec, finite_scores, load_model_for
from guard.config import GuardSettings
from guard.features import PROMPT_PREFIX, RESPONSE_SEP, format_sample, token_span
from guard.monitor import GateScorer, StreamScorer, score_sequence
from inference.types import TokenDelta

log = logging.getLogger(__name__)

# The response is appended to this context; the separator's trailing space is sent as the first
# character of the response text so that BPE merges it into the first word, as in calibration.
_RESPONSE_CONTEXT_SEP = RESPONSE_SEP.rstrip(" ")


class GuardError(RuntimeError):
    """The guard failed to score (model error, context overflow, ...)."""


# ------------------------------------------------------------------------------------------------
# incremental re-tokenisation

class IncrementalRetokenizer:
    """Turns a growing text into guard tokens that are final.

    BPE / SentencePiece tokens never span a whitespace boundary *before* a word (the space is glued to
    the following word: "Ġword", "▁word"), so every token that ends at or before the last whitespace
    of the text can no longer change when more text arrives. Tokens after it are held until the next
    whitespace or the end of the stream. Unbroken runs longer than ``max_tail_chars`` (code, CJK) are
    committed except their last two tokens, which bounds the hold-back; that can, rarely, differ from
    tokenising the full text at once.
    """

    def __init__(self, tokenizer: Any, max_tail_chars: int = 64) -> None:
        self.tok = tokenizer
        self.max_tail = max_tail_chars
        self.text = ""            # everything received
        self.committed = 0        # characters covered by committed tokens

    def feed(self, new_text: str, final: bool = False) -> list[tuple[int, int, int]]:
        """Add text; return newly final tokens as (id, char_start, char_end) in the full text."""
        self.text += new_text
        tail = self.text[self.committed:]
        if not tail:
            return []
        enc = self.tok(tail, return_offsets_mapping=True, add_special_tokens=False)
        ids, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if final:
            n = len(ids)
        else:
            cut = max((i for i, ch in enumerate(tail) if ch.isspace()), default=-1)
            n = sum(1 for (_, b) in offs if b <= cut) if cut > 0 else 0
            # tokens are in order, so count the prefix that ends before the cut
            n = next((i for i, (_, b) in enumerate(offs) if b > cut), len(offs)) if cut > 0 else 0
            if n == 0 and len(tail) > self.max_tail:
                n = max(0, len(ids) - 2)
        out = []
        base = self.committed
        for i in range(n):
            a, b = offs[i]
            out.append((ids[i], base + a, base + b))
        if n:
            self.committed = base + offs[n - 1][1]
            # characters after the last committed token but before the next token (e.g. a trailing
            # space) stay in the tail, so the next token keeps its leading space
        return out


# ------------------------------------------------------------------------------------------------
# the batching engine

@dataclass
class _Job:
    slot: int
    ids: list[int] | None          # None: free the slot once everything queued before has run
    fut: asyncio.Future[Any]


class GuardEngine:
    """Owns the runner; merges all pending work into one forward per step (one thread, in order)."""

    def __init__(self, runner: Any, max_batch: int, threads: int = 1) -> None:
        self.runner = runner
        self.max_batch = max_batch
        self._threads = threads
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nextguard-guard",
                                        initializer=self._init_thread)
        self._slot_lock: asyncio.Lock | None = None
        self._slot_free: asyncio.Condition | None = None
        self.steps = 0
        self.batched_rows = 0

    def _init_thread(self) -> None:
        import torch

        torch.set_num_threads(self._threads)

    def _ensure(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._slot_free = asyncio.Condition()
            self._task = loop.create_task(self._loop(), name="nextguard-guard-batcher")

    async def acquire(self) -> int:
        self._ensure()
        assert self._slot_free is not None
        async with self._slot_free:
            while self.runner.n_active >= self.runner.max_slots:
                await self._slot_free.wait()
            return int(self.runner.alloc())

    async def release(self, slot: int) -> None:
        """Free a slot *through the queue*: a stream cancelled while its forward is queued must not hand
        its slot to a new stream before that forward has run (it would write into the new KV cache)."""
        self._ensure()
        assert self._queue is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Job(slot, None, fut))
        await fut

    async def forward(self, slot: int, ids: Sequence[int]) -> Any:
        """Residual rows (len(ids), d_model) after layer L for new tokens of a slot."""
        self._ensure()
        assert self._queue is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(slot, list(ids), fut))
        return await fut

    async def _loop(self) -> None:
        assert self._queue is not None
        q = self._queue
        loop = asyncio.get_running_loop()
        while True:
            first = await q.get()
            jobs = [first]
            while not q.empty() and len(jobs) < 4 * self.max_batch:
                jobs.append(q.get_nowait())
            frees = [j for j in jobs if j.ids is None]
            jobs = [j for j in jobs if j.ids is not None]
            # one entry per slot (merge successive jobs of a slot), at most max_batch slots per step
            order: list[int] = []
            merged: dict[int, list[_Job]] = {}
            deferred: set[int] = set()
            for j in jobs:
                if j.slot not in merged:
                    if len(order) >= self.max_batch:
                        deferred.add(j.slot)
                        q.put_nowait(j)
                        continue
                    order.append(j.slot)
                    merged[j.slot] = []
                merged[j.slot].append(j)
            for j in [f for f in frees if f.slot in deferred]:
                q.put_nowait(j)         # its slot still has queued work: free it after that
            frees = [f for f in frees if f.slot not in deferred]
            batch = [(s, [t for j in merged[s] for t in (j.ids or [])]) for s in order]
            try:
                outs = await loop.run_in_executor(self._pool, self.runner.step, batch) if batch else []
                self.steps += 1
                self.batched_rows += len(batch)
                for s, out in zip(order, outs, strict=True):
                    k = 0
                    for j in merged[s]:
                        n = len(j.ids or [])
                        if not j.fut.done():
                            j.fut.set_result(out[k:k + n])
                        k += n
            except Exception as e:
                # every waiting stream gets the error and applies its policy; the loop itself lives on
                for s in order:
                    for j in merged[s]:
                        if not j.fut.done():
                            j.fut.set_exception(GuardError(f"{type(e).__name__}: {e}"))
            if frees:
                for j in frees:
                    self.runner.free(j.slot)
                    if not j.fut.done():
                        j.fut.set_result(None)
                assert self._slot_free is not None
                async with self._slot_free:
                    self._slot_free.notify(len(frees))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------------------------------------
# the guard

@dataclass
class _Pending:
    delta: TokenDelta
    char_end: int          # response characters up to the end of this delta
    n_tokens: int          # generator tokens in this delta


@dataclass
class _StreamState:
    scorer: StreamScorer
    gate: GateScorer
    retok: IncrementalRetokenizer | None
    pending: list[_Pending] = field(default_factory=list)
    released_tokens: int = 0
    scored_char_end: int = 0           # response characters covered by scored guard tokens
    scored_ends: list[int] = field(default_factory=list)    # char end of each scored guard token
    scored_g: list[float] = field(default_factory=list)     # aggregated score g of each scored guard token
    released_chars: int = 0


class NextGuard:
    """NExT-Guard monitor over a built artifact directory (see :mod:`guard.bundle`)."""

    def __init__(self, settings: GuardSettings, *, model: Any | None = None, tokenizer: Any | None = None,
                 layer: int | None = None, spec: MonitorSpec | None = None) -> None:
        self.settings = settings
        self._model, self._layer, self._spec = model, layer, spec
        self._tok: Any = tokenizer
        self._engine: GuardEngine | None = None
        self._same_tokenizer = False
        self._name = f"nextguard-{settings.monitored}"
        self._error: str | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def load(self) -> NextGuard:
        """Load the network and artifacts (blocking; call once at start-up)."""
        import torch

        from guard.runner import make_runner

        torch.set_num_threads(self.settings.threads)
        s = self.settings
        if self._model is None:
            self._model, self._tok, self._layer = load_model_for(
                s.artifacts_dir, s.monitored, s.base_model, dtype=s.dtype, device=s.device)
        if self._spec is None:
            self._spec = MonitorSpec.load(Path(s.artifacts_dir) / "monitors" / s.monitored, s.monitored)
        assert self._layer is not None
        runner = make_runner(self._model, self._layer, max_slots=s.max_batch, max_len=s.max_len)
        self._engine = GuardEngine(runner, s.max_batch, s.threads)
        return self

    async def aclose(self) -> None:
        if self._engine is not None:
            await self._engine.close()

    @property
    def ready(self) -> bool:
        return self._engine is not None and self._spec is not None

    @property
    def name(self) -> str:
        return self._name

    @property
    def engine(self) -> GuardEngine:
        if self._engine is None:
            raise GuardError("guard not loaded: call NextGuard.load() first")
        return self._engine

    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def spec(self) -> MonitorSpec:
        assert self._spec is not None
        return self._spec

    def set_generator_tokenizer(self, tokenizer: Any) -> bool:
        """Declare the generator's tokenizer; identical vocabularies let the guard use its ids directly."""
        try:
            self._same_tokenizer = tokenizer is self._tok or tokenizer.get_vocab() == self._tok.get_vocab()
        except AttributeError:
            self._same_tokenizer = False
        return self._same_tokenizer

    # -- thresholds ---------------------------------------------------------------------------------
    def _gate(self, gate: str, policy: GuardPolicy) -> GateScorer:
        thr = policy.prompt_threshold if gate == "prompt" else policy.response_threshold
        if thr is None:
            thr = self.settings.prompt_threshold if gate == "prompt" else self.settings.response_threshold
        return self.spec.scorer(gate, thr, policy.mode or self.settings.mode)

    def _cut(self, gate: GateScorer, row: np.ndarray, score: float, token_offset: int, which: str,
             char_offset: int | None, policy: GuardPolicy) -> SafetyCut | None:
        cat = gate.category_at(row)
        if policy.categories and cat not in policy.categories:
            return None
        feats = tuple(FeatureActivation(i, round(a, 4)) for i, a in gate.top_features(row))
        return SafetyCut(category=cat, score=float(score), threshold=float(gate.threshold), token_offset=token_offset,
                         features=feats, gate=which, char_offset=char_offset)

    def _error_cut(self, which: str, token_offset: int, err: BaseException) -> SafetyCut:
        log.exception("guard error (%s gate), failing closed", which, exc_info=err)
        return SafetyCut(category="guard_error", score=0.0, threshold=0.0, token_offset=token_offset, gate=which,
                         decision="guard_error")

    def threshold(self, gate: str, policy: GuardPolicy) -> float:
        """The threshold in force for ``gate`` ("prompt" | "response") under ``policy``."""
        if gate not in ("prompt", "response"):
            raise ValueError(f"Unknown gate '{gate}'. Available: prompt, response")
        return float(self._gate(gate, policy).threshold)

    def describe_features(self) -> dict[str, Any]:
        """Selected SAE latents per gate and category with their weights s_j and the calibrated thresholds."""
        th = self.spec.thresholds
        out: dict[str, Any] = {"mode": th.mode, "monitored": self.spec.name}
        for gate, gf in self.spec.gates.items():
            cat_thr = th.prompt_categories if gate == "prompt" else th.response_categories
            out[gate] = {
                "threshold": th.prompt if gate == "prompt" else th.response,
                "overall": [{"id": i, "weight": w} for i, w in zip(gf.overall.ids, gf.overall.weights, strict=True)],
                "categories": {c: {"threshold": cat_thr.get(c),
                                   "features": [{"id": i, "weight": w} for i, w in zip(fs.ids, fs.weights, strict=True)]}
                               for c, fs in gf.categories.items()},
            }
        return out

    # -- whole texts (prompt gate, score endpoint, moderation) --------------------------------------
    async def _score_text(self, prompt: str, response: str | None, gate: GateScorer) -> dict[str, Any]:
        fs = format_sample(prompt, response)
        enc = self._tok(fs.text, return_offsets_mapping=True, add_special_tokens=False)
        ids, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if len(ids) > self.settings.max_len:
            raise GuardError(f"text of {len(ids)} tokens exceeds the guard's max_len {self.settings.max_len}")
        span = token_span(offs, fs.char_start, fs.char_end)
        slot = await self.engine.acquire()
        try:
            resid = await self.engine.forward(slot, ids)
        finally:
            await self.engine.release(slot)
        acts = self.spec.encoder.encode(resid).numpy()
        norms = resid.norm(dim=-1).numpy()
        s = score_sequence(gate, acts, norms, span, norm_ratio=self.settings.norm_ratio)
        a_span = acts[span[0]:span[1]] * s.kept[:, None]
        return {"ids": ids, "offs": offs, "span": span, "fs": fs, "seq": s, "acts": a_span}

    async def check_prompt(self, prompt_text: str, policy: GuardPolicy) -> SafetyCut | None:
        if not policy.enabled or not self.settings.prompt_gate:
            return None
        gate = self._gate("prompt", policy)
        try:
            r = await self._score_text(prompt_text, None, gate)
        except Exception as e:
            if policy.fail_closed:
                return self._error_cut("prompt", 0, e)
            report_fail_open("prompt", 0, e)
            return None
        s = r["seq"]
        if s.cut is None:
            return None
        t = r["span"][0] + s.cut
        char = max(r["offs"][t][0], r["fs"].char_start) - r["fs"].char_start
        return self._cut(gate, r["acts"][s.cut], float(s.g[s.cut]), int(s.cut), "prompt", int(char), policy)

    async def score_text(self, prompt: str, response: str | None = None) -> dict[str, Any]:
        """``{"tokens", "scores", "threshold", "cut"}`` over the response tokens (or the prompt's)."""
        which = "prompt" if response is None else "response"
        policy = GuardPolicy()
        gate = self._gate(which, policy)
        r = await self._score_text(prompt, response, gate)
        s = r["seq"]
        s0, s1 = r["span"]
        cut = None
        if s.cut is not None:
            t = s0 + s.cut
            row = r["acts"][s.cut]
            cut = {"token_offset": int(s.cut), "char_offset": int(max(r["offs"][t][0], r["fs"].char_start) - r["fs"].char_start),
                   "score": float(s.g[s.cut]), "category": gate.category_at(row),
                   "features": [{"id": i, "activation": a} for i, a in gate.top_features(row)]}
        return {"tokens": [self._tok.decode([i]) for i in r["ids"][s0:s1]], "scores": finite_scores(s.g, gate.threshold),
                "threshold": float(gate.threshold), "cut": cut}

    async def moderate(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """OpenAI moderation shape. Each text is scored as a prompt. ``category_scores`` maps the
        category's max score over its own calibrated threshold, r, to r / (1 + r) (0.5 at threshold);
        ``flagged`` is the overall gate's decision."""
        gate = self._gate("prompt", GuardPolicy())
        out = []
        for text in texts:
            r = await self._score_text(text, None, gate)
            s = r["seq"]
            cats = gate.category_token_scores(r["acts"])
            scores, flags = {}, {}
            for c, v in cats.items():
                thr = gate.category_thresholds.get(c)
                m = float(np.max(v)) if len(v) else 0.0
                ratio = max(0.0, m / thr) if thr and thr > 0 else 0.0
                scores[c] = ratio / (1.0 + ratio)
                flags[c] = bool(s.cut is not None and ratio > 1.0)
            out.append({"flagged": s.cut is not None, "categories": flags, "category_scores": scores})
        return out

    # -- the response gate -------------------------------------------------------------------------
    async def watch(
        self, prompt_text: str, deltas: AsyncIterator[TokenDelta], policy: GuardPolicy,
    ) -> AsyncIterator[TokenDelta | SafetyCut]:
        if not policy.enabled:
            async for d in deltas:
                yield d
            return
        hold = max(1, int(policy.hold_back))
        try:
            gate = self._gate("response", policy)
            slot = await self.engine.acquire()
        except Exception as e:
            if policy.fail_closed:
                yield self._error_cut("response", 0, e)
                return
            report_fail_open("response", 0, e)
            async for d in deltas:
                yield d
            return
        st = _StreamState(
            scorer=StreamScorer(gate, norm_ratio=self.settings.norm_ratio), gate=gate,
            retok=None if self._same_tokenizer else IncrementalRetokenizer(self._tok))
        failed_open = False
        try:
            ctx = self._tok(PROMPT_PREFIX + prompt_text + _RESPONSE_CONTEXT_SEP, add_special_tokens=False)["input_ids"]
            resid = await self.engine.forward(slot, ctx)
            st.scorer.context(resid.norm(dim=-1).tolist())
            text_len = 0
            first = True
            async for d in deltas:
                text = d.text
                if first and st.retok is not None:
                    text = " " + text.lstrip(" ")     # the format's "Assistant: " space, merged as in calibration
                    first = False
                text_len += len(text)
                st.pending.append(_Pending(d, text_len, len(d.token_ids)))
                final = d.finish_reason is not None
                if st.retok is not None:
                    new = st.retok.feed(text, final=final)
                else:
                    new = [(t, -1, -1) for t in d.token_ids]
                cut = await self._score_new(slot, st, new, policy, final)
                if cut is not None:
                    yield cut
                    return
                for p in self._releasable(st, hold, final):
                    yield p
                if final:
                    return
            # the engine ended without a finish_reason: flush what is left
            if st.retok is not None:
                cut = await self._score_new(slot, st, st.retok.feed("", final=True), policy, True)
                if cut is not None:
                    yield cut
                    return
            for p in self._releasable(st, hold, True):
                yield p
        except GeneratorExit:
            raise
        except Exception as e:
            if policy.fail_closed:
                yield self._error_cut("response", st.released_tokens, e)
                return
            report_fail_open("response", st.released_tokens, e)
            failed_open = True
        finally:
            await self.engine.release(slot)
        if failed_open:
            log.warning("guard failed; policy is fail-open, passing the rest of the stream unscored")
            for pend in st.pending:
                yield pend.delta
            async for d in deltas:
                yield d

    async def _score_new(self, slot: int, st: _StreamState, new: list[tuple[int, int, int]], policy: GuardPolicy,
                         final: bool) -> SafetyCut | None:
        if not new:
            return None
        resid = await self.engine.forward(slot, [t for t, _, _ in new])
        acts = self.spec.encoder.encode(resid).numpy()
        norms = resid.norm(dim=-1).numpy()
        for k, (_, a, b) in enumerate(new):
            c, g, now = st.scorer.step(acts[k], float(norms[k]))
            if now:
                row = st.scorer.last["row"]
                # the withheld deltas start at the first pending one; its first token is the offset
                char = a if a >= 0 else None
                cut = self._cut(st.gate, row, g, st.released_tokens, "response",
                                None if char is None else max(0, char - 1), policy)
                if cut is not None:
                    return cut
            if b >= 0:
                st.scored_ends.append(b)
            else:
                # same tokenizer: one guard token per generator token, in order
                st.scored_ends.append(len(st.scored_ends) + 1)
            st.scored_g.append(g if np.isfinite(g) else min(c, st.gate.threshold))
        return None

    def _releasable(self, st: _StreamState, hold: int, final: bool) -> list[TokenDelta]:
        """Pop the deltas that may leave: every guard token over their characters (tokens) is scored,
        and ``hold - 1`` more guard tokens after them are scored too. At the end everything is scored."""
        out: list[TokenDelta] = []
        ends = st.scored_ends
        while st.pending:
            p = st.pending[0]
            if not final:
                if st.retok is None:
                    reach = st.released_tokens + p.n_tokens          # guard tokens == generator tokens
                    if len(ends) < reach + (hold - 1):
                        break
                elif p.char_end > 0:
                    k = next((i for i, e in enumerate(ends) if e >= p.char_end), None)
                    if k is None or len(ends) - 1 < k + (hold - 1):
                        break
            st.pending.pop(0)
            p.delta.scores = self._delta_scores(st, p)
            st.released_tokens += p.n_tokens
            st.released_chars = p.char_end
            out.append(p.delta)
        return out

    @staticmethod
    def _delta_scores(st: _StreamState, p: _Pending) -> list[float]:
        """Scores for the generator tokens of a released delta. Same tokenizer: exact, one per token.
        Re-tokenised: guard tokens do not align with generator tokens, so every token of the delta gets
        the highest score of the guard tokens ending inside the delta (or of the one spanning it)."""
        if p.n_tokens == 0:
            return []
        thr = float(st.gate.threshold)
        if st.retok is None:
            a = st.released_tokens
            # debounce's first token scores -inf (it can never cut); report the threshold, as /v1/guard/score does,
            # so the JSON carries a number rather than null
            return [float(x) if math.isfinite(x) else thr for x in st.scored_g[a:a + p.n_tokens]]
        gs = [g for e, g in zip(st.scored_ends, st.scored_g, strict=True) if st.released_chars < e <= p.char_end]
        if not gs:
            nxt = next((g for e, g in zip(st.scored_ends, st.scored_g, strict=True) if e > p.char_end), None)
            gs = [nxt] if nxt is not None else [float(st.gate.threshold)]
        top = float(max(gs))
        return [top if math.isfinite(top) else thr] * p.n_tokens
