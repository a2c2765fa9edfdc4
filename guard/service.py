"""The streaming runtime: :class:`NextGuard` implements :class:`guard.api.StreamGuard`.

Shape::

    watch(stream A) ─┐                         ┌─> rows for A -> SelectedEncoder (K columns) -> StreamScorer
    watch(stream B) ─┼─> GuardEngine queue ───>│   one runner step for every stream with pending tokens
    check_prompt    ─┘   (guard.batching)      └─> rows for B ...      (layers <= L only, own KV slots)

* The guard reads the conversation in the one format of :mod:`guard.text`: the prompt gate scores every
  turn, the response gate reads the conversation as context and scores the response, whose text is
  re-tokenised with the guard's tokenizer (:mod:`guard.retokenize`) so the stream sees exactly the tokens a
  whole-sample score of the same text reads.
* Hold-back: a generator delta is yielded only when the guard has scored every guard token that covers its
  characters, plus ``hold_back - 1`` further guard tokens. On a cut the pending deltas are dropped and a
  :class:`SafetyCut` is yielded last, so the offending token never leaves. A word's guard tokens are final
  only once a later whitespace arrives; with ``score_open_tail`` the unfinished word is also read as it
  stands (then forgotten), so the text so far leaves after one guard step instead of one generator step
  more, and the finished word is scored again before anything after it leaves.
* Tokenising whole conversations runs in a worker thread, not on the event loop.
* One forward of a conversation for both gates: a stream offers the rows of its context forward (the
  conversation, then the assistant label) while it runs it, and a prompt gate over the same conversation
  started beside it scores the first of those rows instead of forwarding the text again (the ids are
  compared; anything else, or a stream that ended first, and the gate reads the text itself).
* Errors inside the guard: fail closed (a ``guard_error`` cut) unless the policy says fail open.
* Guard slots (``max_batch``, one per prompt being scored or stream being watched) are shared round-robin
  between tenants (:data:`guard.api.GUARD_CLIENT`) and waited for at most ``slot_wait_s``: then the prompt
  gate raises :class:`~guard.api.GuardBusy` and a stream ends with a ``guard_busy`` cut, whatever the policy.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from guard.api import FeatureActivation, GuardBusy, GuardInputError, GuardPolicy, SafetyCut, report_fail_open
from guard.batching import GuardEngine, GuardError
from guard.bundle import MonitorSpec, load_model_for
from guard.config import GuardSettings
from guard.monitor import GateScorer, StreamScorer, peak, score_sequence
from guard.retokenize import IncrementalRetokenizer
from guard.text import (
    Conversation,
    GuardText,
    ResponseFeed,
    context_chars,
    conversation_text,
    prompt_text,
    prompt_views,
    response_context,
    response_text,
    split_carry,
    token_span,
    user,
)
from inference.types import TokenDelta

log = logging.getLogger(__name__)

__all__ = ["GuardError", "NextGuard"]


@dataclass
class _Pending:
    delta: TokenDelta
    char_end: int          # response characters (as the guard reads them) up to the end of this delta
    n_tokens: int          # generator tokens in this delta


def _check_unicode(text: str) -> None:
    """A lone surrogate (JSON allows ``\\ud800``) cannot be encoded, so no tokenizer can read the text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GuardInputError(f"The text is not valid Unicode: a lone surrogate at character {e.start}.") from None


class _UpstreamError(Exception):
    """An error raised by the stream the guard watches (the engine), carried past the guard's own failure
    handling: an engine error is the engine's, never a guard cut."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def _upstream(deltas: AsyncIterator[TokenDelta]) -> AsyncIterator[TokenDelta]:
    it = deltas.__aiter__()
    while True:
        try:
            d = await anext(it)
        except StopAsyncIteration:
            return
        except Exception as e:
            raise _UpstreamError(e) from e
        yield d


class _ReadAhead:
    """The watched stream, read from the moment the guard holds a slot for it, whatever the guard does
    meanwhile: the generator gets its request at once, so its prefill runs while the guard still reads the
    conversation, instead of after. The generator buffers its output anyway; only the moment the request
    goes in moves. Closing this cancels the reader, which closes the upstream (an engine aborts)."""

    _END = object()

    def __init__(self, source: AsyncIterator[TokenDelta]) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._arrived = asyncio.Event()
        self._source = source
        self._task = asyncio.create_task(self._pump(source), name="nextguard-read-ahead")

    def _put(self, item: Any) -> None:
        self._items.append(item)
        self._arrived.set()

    async def _pump(self, source: AsyncIterator[TokenDelta]) -> None:
        try:
            async for d in source:
                self._put(d)
        except asyncio.CancelledError:
            raise
        except BaseException as e:      # raised again where the guard reads it
            self._put(e)
            return
        self._put(self._END)

    def ready(self) -> list[TokenDelta]:
        """The deltas already read and waiting, without waiting for more (an end or an error stays queued
        for the next read)."""
        out: list[TokenDelta] = []
        while self._items and not (self._items[0] is self._END or isinstance(self._items[0], BaseException)):
            out.append(self._items.popleft())
        return out

    def __aiter__(self) -> _ReadAhead:
        return self

    async def __anext__(self) -> TokenDelta:
        while not self._items:
            self._arrived.clear()
            await self._arrived.wait()
        got = self._items[0]
        if got is self._END:
            raise StopAsyncIteration        # stays queued: every later read ends too
        if isinstance(got, BaseException):
            raise got
        return cast(TokenDelta, self._items.popleft())

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        close = getattr(self._source, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()


@dataclass
class _StreamState:
    scorer: StreamScorer
    gate: GateScorer
    retok: IncrementalRetokenizer
    feed: ResponseFeed = field(default_factory=ResponseFeed)
    pending: list[_Pending] = field(default_factory=list)
    released_tokens: int = 0
    scored_ends: list[int] = field(default_factory=list)    # char end of each scored guard token
    scored_c: list[float] = field(default_factory=list)     # score c of each scored guard token
    released_chars: int = 0
    char_base: int = 0          # response characters carried from the prompt (not this stream's to release)


class NextGuard:
    """NExT-Guard monitor over a built artifact directory (see :mod:`guard.bundle`)."""

    def __init__(self, settings: GuardSettings, *, model: Any | None = None, tokenizer: Any | None = None,
                 layer: int | None = None, spec: MonitorSpec | None = None) -> None:
        self.settings = settings
        self._model, self._layer, self._spec = model, layer, spec
        self._tok: Any = tokenizer
        self._engine: GuardEngine | None = None
        self._name = f"nextguard-{settings.monitored}"
        # conversation text -> the rows of a stream's context forward (its ids, latents, norms), while that
        # stream runs: the prompt gate reads the same conversation, so it scores those rows instead of
        # forwarding the conversation a second time
        self._contexts: dict[str, asyncio.Future[tuple[list[int], Any, Any]]] = {}

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
        self._engine = GuardEngine(runner, s.max_batch, s.threads, readout=self.readout, prefix_cache=s.prefix_cache)
        return self

    def readout(self, resid: Any) -> tuple[np.ndarray, np.ndarray]:
        """Residual rows -> (the monitor's latents, residual norms); runs in the guard's thread, once per step."""
        return self.spec.encoder.encode(resid).numpy(), resid.float().norm(dim=-1).numpy()

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
        """Kept for callers that declare the generator's tokenizer; the guard always re-tokenises the text, so
        that the stream reads the same tokens as every other path. Returns whether the vocabularies match."""
        try:
            return bool(tokenizer is self._tok or tokenizer.get_vocab() == self._tok.get_vocab())
        except AttributeError:
            return False

    # -- thresholds ---------------------------------------------------------------------------------
    def threshold(self, gate: str, policy: GuardPolicy) -> float:
        """The request's threshold, else the operator's threshold, else the operator's budget, else the build's."""
        return self._threshold_and_budget(gate, policy)[0]

    def _threshold_and_budget(self, gate: str, policy: GuardPolicy) -> tuple[float, float | None]:
        """:meth:`threshold`, and the operator's budget where that is what set it."""
        thr = policy.prompt_threshold if gate == "prompt" else policy.response_threshold
        if thr is None:
            thr = self.settings.prompt_threshold if gate == "prompt" else self.settings.response_threshold
        if thr is None:
            budget = self.settings.prompt_budget if gate == "prompt" else self.settings.response_budget
            if budget is not None:
                return self.spec.gates[gate].threshold_for_budget(budget), budget
        return float(self.spec.threshold(gate) if thr is None else thr), None

    def _gate(self, gate: str, policy: GuardPolicy) -> GateScorer:
        thr, budget = self._threshold_and_budget(gate, policy)
        return self.spec.scorer(gate, thr) if budget is None else self.spec.scorer_for_budget(gate, budget)

    def describe_features(self) -> dict[str, Any]:
        """The read-out of every gate: latents with weights, pooling, the calibrated thresholds."""
        out: dict[str, Any] = {"monitored": self.spec.name}
        for gate, g in self.spec.gates.items():
            out[gate] = {
                "threshold": g.threshold, "bias": g.overall.bias,
                "pooling": {"window": g.pooling.window, "min_count": g.pooling.min_count, "final": g.pooling.final},
                "overall": [{"id": i, "weight": w} for i, w in zip(g.overall.ids, g.overall.weights, strict=True)],
                "categories": {c: {"threshold": g.category_thresholds.get(c),
                                   "features": [{"id": i, "weight": w} for i, w in zip(h.ids, h.weights, strict=True)]}
                               for c, h in g.categories.items()},
            }
            if g.probe is not None:
                # the residual probe reads the residual itself: it has a threshold and a bias, but no latents
                out[gate]["residual_probe"] = {"threshold": g.probe_threshold, "bias": g.probe.bias,
                                               "offset_to_gate_scale": g.probe_offset,
                                               "added_with_weight": g.probe_weight}
        return out

    def _cut(self, category: str, feats: list[tuple[int, float]], score: float, threshold: float, token_offset: int,
             which: str, char_offset: int | None, policy: GuardPolicy, trigger: str = "readout") -> SafetyCut | None:
        if policy.categories and category not in policy.categories:
            return None
        return SafetyCut(category=category, score=float(score), threshold=float(threshold), token_offset=token_offset,
                         features=tuple(FeatureActivation(i, round(a, 4)) for i, a in feats), gate=which,
                         char_offset=char_offset, trigger=trigger)

    def _error_cut(self, which: str, token_offset: int, err: BaseException) -> SafetyCut:
        log.error("guard error (%s gate), failing closed: %s: %s", which, type(err).__name__, err)
        return SafetyCut(category="guard_error", score=0.0, threshold=0.0, token_offset=token_offset, gate=which,
                         decision="guard_error")

    # -- whole texts (prompt gate, score endpoint, moderation) --------------------------------------
    def _encode(self, gt: GuardText) -> tuple[list[int], list[tuple[int, int]], tuple[int, int]]:
        _check_unicode(gt.text)
        enc = self._tok(gt.text, return_offsets_mapping=True, add_special_tokens=False)
        ids, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        return ids, offs, token_span(offs, gt.char_start, gt.char_end)

    async def _score_text(self, gt: GuardText, gate: GateScorer) -> dict[str, Any]:
        ids, offs, span = await asyncio.to_thread(self._encode, gt)
        if len(ids) > self.settings.max_len:
            raise GuardInputError(f"The text is {len(ids)} guard tokens long; the guard scores at most "
                                  f"{self.settings.max_len}. Send a shorter text.")
        rows = await self._shared_rows(gt.text, ids)
        if rows is None:
            slot = await self.engine.acquire(self.settings.slot_wait_s)    # GuardBusy past the wait
            try:
                rows = await self.engine.forward(slot, ids)
            finally:
                await self.engine.release(slot)
        acts, norms = rows
        ctx_span = None if gt.context is None else token_span(offs, *gt.context)
        s = score_sequence(gate, acts, norms, span, norm_ratio=self.settings.norm_ratio, context_span=ctx_span)
        return {"ids": ids, "offs": offs, "span": span, "gt": gt, "seq": s}

    async def _shared_rows(self, text: str, ids: list[int]) -> tuple[Any, Any] | None:
        """The rows of ``ids`` from a running stream whose context starts with this text, or None. The
        model is causal, so a prefix's rows do not depend on what follows; the ids are compared, not assumed."""
        fut = self._contexts.get(text)
        if fut is None:
            return None
        try:
            ctx_ids, acts, norms = await asyncio.shield(fut)
        except Exception:
            return None          # that stream failed or ended before its forward: read the text here
        if ctx_ids[:len(ids)] != ids:
            return None
        return acts[:len(ids)], norms[:len(ids)]

    def _offer_context(self, text: str) -> asyncio.Future[tuple[list[int], Any, Any]] | None:
        if text in self._contexts:
            return None          # another stream of the same conversation offers it already
        fut: asyncio.Future[tuple[list[int], Any, Any]] = asyncio.get_running_loop().create_future()
        self._contexts[text] = fut
        return fut

    def _withdraw_context(self, text: str, fut: asyncio.Future[Any] | None) -> None:
        if fut is None:
            return
        if self._contexts.get(text) is fut:
            del self._contexts[text]
        if not fut.done():
            fut.set_exception(GuardError("the stream ended before its context was read"))
        elif not fut.cancelled():
            fut.exception()      # retrieved: nobody may have waited for it

    def _cut_info(self, r: dict[str, Any], gate: GateScorer) -> dict[str, Any] | None:
        s = r["seq"]
        if s.cut is None:
            return None
        w = gate.pooling.window
        rows = s.acts[max(0, s.cut - w + 1): s.cut + 1]
        cats = {c: float(v[s.cut]) for c, v in gate.category_scores(s.acts[: s.cut + 1]).items()}
        t = r["span"][0] + s.cut
        char = max(r["offs"][t][0], r["gt"].char_start) - r["gt"].char_start
        return {"token_offset": int(s.cut), "char_offset": int(char), "score": float(s.c[s.cut]),
                "category": gate.category_of(cats), "features": gate.top_features(rows)}

    async def check_prompt(self, conversation: Conversation, policy: GuardPolicy) -> SafetyCut | None:
        if not policy.enabled or not self.settings.prompt_gate:
            return None
        gate = self._gate("prompt", policy)
        try:
            # the whole conversation and each view, in one guard step (the engine batches pending forwards)
            views = prompt_views(conversation) if self.settings.prompt_views else []
            texts = [prompt_text(conversation)] + [prompt_text(v) for v in views]
            rs = await asyncio.gather(*(self._score_text(t, gate) for t in texts))
        except (GuardBusy, GuardInputError):
            raise           # not a guard fault: the caller answers 503 (retry) or 400 (the input)
        except Exception as e:
            if policy.fail_closed:
                return self._error_cut("prompt", 0, e)
            report_fail_open("prompt", 0, e)
            return None
        info = self._cut_info(rs[0], gate)
        if info is None:
            crossed = [r for r in rs[1:] if r["seq"].cut is not None]
            if not crossed:
                return None
            # A view decided: its category and features, at the end of the prompt (offsets inside a view would
            # point into a text the client never sent).
            view = max(crossed, key=lambda r: float(r["seq"].c[r["seq"].cut]))
            info = self._cut_info(view, gate)
            assert info is not None
            whole, last = rs[0], rs[0]["span"][1] - 1
            info["token_offset"] = int(last - whole["span"][0])
            info["char_offset"] = int(max(whole["offs"][last][0], whole["gt"].char_start) - whole["gt"].char_start)
        return self._cut(info["category"], info["features"], info["score"], gate.threshold, info["token_offset"],
                         "prompt", info["char_offset"], policy,
                         "readout" if gate.probe is None or gate.probe_weight is None else "combined")

    async def score_text(self, conversation: Conversation | str, response: str | None = None) -> dict[str, Any]:
        """``{"tokens", "scores", "threshold", "cut"}`` over the response tokens (or the conversation's)."""
        conv = user(conversation) if isinstance(conversation, str) else conversation
        which = "prompt" if response is None else "response"
        gate = self._gate(which, GuardPolicy())
        gt = prompt_text(conv) if response is None else response_text(conv, response)
        r = await self._score_text(gt, gate)
        s0, s1 = r["span"]
        info = self._cut_info(r, gate)
        if info is not None:
            info["features"] = [{"id": i, "activation": a} for i, a in info["features"]]
        return {"tokens": [self._tok.decode([i]) for i in r["ids"][s0:s1]], "scores": [float(x) for x in r["seq"].c],
                "threshold": float(gate.threshold), "cut": info}

    async def moderate(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """OpenAI moderation shape. Each text is scored as a user message by the prompt gate.
        ``category_scores`` are the per-category read-outs' deciding scores (the peak; the last for a gate that
        scores the whole text) as probabilities (logistic of the
        margin over each category's own threshold: 0.5 at its threshold); ``flagged`` is the overall gate's
        decision, and a category is flagged when the overall gate flags and the category is over its own."""
        gate = self._gate("prompt", GuardPolicy())
        out = []
        for text in texts:
            r = await self._score_text(prompt_text(user(text)), gate)
            s = r["seq"]
            scores, flags = {}, {}
            for c, v in gate.category_scores(s.acts).items():
                m = peak(v, gate.pooling) if len(v) else -math.inf
                margin = m - gate.category_thresholds.get(c, 0.0)
                scores[c] = 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, margin))))
                flags[c] = bool(s.cut is not None and margin > 0)
            out.append({"flagged": s.cut is not None, "categories": flags, "category_scores": scores})
        return out

    # -- the response gate -------------------------------------------------------------------------
    async def watch(self, conversation: Conversation, deltas: AsyncIterator[TokenDelta],
                    policy: GuardPolicy) -> AsyncIterator[TokenDelta | SafetyCut]:
        if not policy.enabled:
            async for d in deltas:
                yield d
            return
        hold = max(1, int(policy.hold_back))
        context, carry = split_carry(conversation)
        # offered before the first await, so a prompt gate started beside this stream finds it
        try:
            key = conversation_text(context)
        except ValueError:
            key, offer = "", None        # the context forward below reports it
        else:
            offer = self._offer_context(key)
        try:
            try:
                gate = self._gate("response", policy)
                slot = await self.engine.acquire(self.settings.slot_wait_s)
            except GuardBusy as e:
                # Always closed, even under a fail-open policy: were an overloaded guard to pass text unscored,
                # flooding the guard would be a way around it. Nothing has been generated yet.
                log.warning("guard busy, the stream ends before any text: %s", e)
                yield SafetyCut(category="guard_busy", score=0.0, threshold=0.0, token_offset=0, gate="response",
                                decision="guard_busy")
                return
            except Exception as e:
                if policy.fail_closed:
                    yield self._error_cut("response", 0, e)
                    return
                report_fail_open("response", 0, e)
                async for d in deltas:
                    yield d
                return
            st = _StreamState(scorer=StreamScorer(gate, norm_ratio=self.settings.norm_ratio), gate=gate,
                              retok=IncrementalRetokenizer(self._tok))
            failed_open = False
            upstream = _ReadAhead(deltas)       # the generator starts now, beside the context forward below
            try:
                ctx_text = response_context(context)
                enc = await asyncio.to_thread(lambda: self._tok(ctx_text, add_special_tokens=False,
                                                                return_offsets_mapping=True))
                ctx = list(enc["input_ids"])
                ctx_span = token_span([tuple(o) for o in enc["offset_mapping"]], *context_chars(context))
                if len(ctx) >= self.settings.max_len:
                    raise GuardError(f"conversation of {len(ctx)} tokens exceeds the guard's max_len {self.settings.max_len}")
                ctx_acts, ctx_norms = await self.engine.forward(slot, ctx)
                if offer is not None and not offer.done():
                    offer.set_result((ctx, ctx_acts, ctx_norms))
                    # a prompt gate already waiting has it; one that comes later reads the text itself, so
                    # the rows are not kept for the whole stream
                    self._withdraw_context(key, offer)
                st.scorer.context(ctx_norms.tolist(), ctx_acts, ctx_span)
                text_len = 0
                if carry:
                    # The answer so far (already the client's) fills the window before the first new token, so a
                    # continuation asked for a few tokens at a time is cut where it would be cut in one stream.
                    text = st.feed(carry)
                    text_len = st.char_base = st.released_chars = len(text)
                    _, cut = await self._score_new(slot, st, st.retok.feed(text, final=False), policy, hold)
                    if cut is not None:      # (nothing of this stream is pending yet)
                        yield cut
                        return
                async for first in _upstream(upstream):
                    # Everything the generator produced while the last step ran is scored in one step: a stream
                    # keeps pace with its generator instead of taking one guard step per delta.
                    text = ""
                    final = False
                    for d in (first, *upstream.ready()):
                        piece = st.feed(d.text)
                        text += piece
                        text_len += len(piece)
                        st.pending.append(_Pending(d, text_len, len(d.token_ids)))
                        final = d.finish_reason is not None
                        if final:
                            break
                    new = st.retok.feed(text, final=final)
                    tail = st.retok.open_tail() if self.settings.score_open_tail and not final else []
                    released, cut = await self._score_new(slot, st, new, policy, hold, tail)
                    for p in released:
                        yield p
                    if cut is not None:
                        yield cut
                        return
                    for p in self._releasable(st, hold, final):
                        yield p
                    if final:
                        return
                # the engine ended without a finish_reason: flush what is left
                released, cut = await self._score_new(slot, st, st.retok.feed("", final=True), policy, hold)
                for p in released:
                    yield p
                if cut is not None:
                    yield cut
                    return
                for p in self._releasable(st, hold, True):
                    yield p
            except GeneratorExit:
                raise
            except _UpstreamError as e:
                raise e.error from None
            except Exception as e:
                if policy.fail_closed:
                    yield self._error_cut("response", st.released_tokens, e)
                    return
                report_fail_open("response", st.released_tokens, e)
                failed_open = True
            finally:
                await self.engine.release(slot)
                if not failed_open:
                    await upstream.aclose()
            if failed_open:
                log.warning("guard failed; policy is fail-open, passing the rest of the stream unscored")
                try:
                    for pend in st.pending:
                        yield pend.delta
                    async for d in upstream:
                        yield d
                finally:
                    await upstream.aclose()
        finally:
            self._withdraw_context(key, offer)

    async def _score_new(self, slot: int, st: _StreamState, new: list[tuple[int, int, int]],
                         policy: GuardPolicy, hold: int, tail: list[tuple[int, int, int]] | None = None,
                         ) -> tuple[list[TokenDelta], SafetyCut | None]:
        """Score new guard tokens in one step (they may span several deltas). Where a token crosses the
        threshold, the deltas releasable before it leave first (in order), then the cut, if the policy cuts.

        ``tail``: the unfinished word's tokens, read in the same step and then forgotten by the slot and the
        scorer. If none of them crosses the threshold, the deltas they cover may leave now: the text released
        was scored as it stands. They are scored again, as final tokens, once the word is finished, and only
        final tokens cut (a word's tokens can change as it grows)."""
        released: list[TokenDelta] = []
        tail = tail or []
        if not new and not tail:
            return released, None
        acts, norms = await self.engine.forward(slot, [t for t, _, _ in new + tail], provisional=len(tail))
        for k, (_, a, b) in enumerate(new):
            c, now = st.scorer.step(acts[k], float(norms[k]))
            if now:
                category, feats = st.scorer.cut_details()
                released += self._releasable(st, hold, False)
                # response characters are counted after the label's space, which the first delta carries
                cut = self._cut(category, feats, c, st.gate.threshold, st.released_tokens, "response",
                                max(0, a - 1 - st.char_base), policy, st.scorer.trigger)
                if cut is not None:
                    return released, cut
            st.scored_ends.append(b)
            st.scored_c.append(c)
        if tail:
            released += self._release_on_tail(st, tail, acts[len(new):], norms[len(new):], hold)
        return released, None

    def _release_on_tail(self, st: _StreamState, tail: list[tuple[int, int, int]], acts: Any, norms: Any,
                         hold: int) -> list[TokenDelta]:
        saved = st.scorer.snapshot()
        n_final = len(st.scored_ends)
        try:
            for k, (_, _, b) in enumerate(tail):
                c, now = st.scorer.step(acts[k], float(norms[k]))
                if now:
                    return []      # the final tokens decide, once the word is finished
                st.scored_ends.append(b)
                st.scored_c.append(c)
            return self._releasable(st, hold, False)
        finally:
            st.scorer.restore(saved)
            del st.scored_ends[n_final:], st.scored_c[n_final:]

    def _releasable(self, st: _StreamState, hold: int, final: bool) -> list[TokenDelta]:
        """Pop the deltas that may leave: every guard token over their characters is scored, and ``hold - 1``
        more guard tokens after them are scored too. At the end everything is scored."""
        out: list[TokenDelta] = []
        ends = st.scored_ends
        while st.pending:
            p = st.pending[0]
            if not final and p.char_end > 0:
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
        """Scores for the generator tokens of a released delta: guard tokens do not align with generator
        tokens, so every token of the delta gets the highest score of the guard tokens ending inside it (or of
        the one spanning it)."""
        if p.n_tokens == 0:
            return []
        cs = [c for e, c in zip(st.scored_ends, st.scored_c, strict=True) if st.released_chars < e <= p.char_end]
        if not cs:
            nxt = next((c for e, c in zip(st.scored_ends, st.scored_c, strict=True) if e > p.char_end), None)
            cs = [nxt] if nxt is not None else [float(st.gate.threshold)]
        return [float(max(cs))] * p.n_tokens
