"""Pieces shared by the chat and completions serving classes: request → engine options, the per-choice
stream chain (engine → guard), and the merge of several choices into one stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway import metrics
from gateway.errors import OpenAIError, bad_request, not_found, not_ready
from gateway.protocol import UNSERVED_HINTS, RequestBase
from guard.api import FAIL_OPEN_SINK, GuardBusy, GuardFailure, GuardPolicy, SafetyCut, StreamGuard
from guard.text import Conversation
from inference.engine import EngineClient, EngineError, InvalidOptionsError, PromptTooLongError
from inference.types import SamplingOptions, TokenDelta

log = logging.getLogger(__name__)

Item = TokenDelta | SafetyCut
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServingLimits:
    """Per-request bounds (``ServerSettings``): fan-out, the prompt gate's wait, inline tokenising."""

    max_prompts: int = 32              # /v1/completions prompt list
    max_n: int = 16                    # choices per prompt
    guard_wait_s: float = 30.0         # prompt gate: guard slot + scoring, then 503
    tokenize_inline_chars: int = 16384  # larger inputs are tokenised in a worker thread
    echo_alternatives_with_guard: bool = False   # top alternatives of echoed prompt tokens while guarded
    overlap_prompt_gate: bool = True   # choices start while the prompt gate scores (nothing leaves before it passes)

    def check_fan_out(self, prompts: int, n: int) -> int:
        """The number of choices (engine requests) a request asks for; 400 over the bounds."""
        if prompts > self.max_prompts:
            raise bad_request(
                f"'prompt' holds {prompts} prompts; this deployment accepts at most {self.max_prompts} per request.",
                param="prompt", code="too_many_prompts",
            )
        if n > self.max_n:
            raise bad_request(f"'n' is {n}; this deployment accepts at most {self.max_n}.", param="n",
                              code="too_many_choices")
        return prompts * n

    async def off_loop(self, n_chars: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: inline for small inputs, in a worker thread for big ones, so that tokenising a
        multi-megabyte prompt does not stall every stream on the event loop."""
        if n_chars > self.tokenize_inline_chars:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(engine: EngineClient | None, model: str) -> EngineClient:
    if engine is None or not engine.ready:
        raise not_ready()
    card = engine.model_card
    if model not in (card.id, *card.aliases):
        raise not_found(
            f"The model '{model}' does not exist. Available: {card.id}", param="model", code="model_not_found"
        )
    return engine


def check_fields(req: RequestBase) -> None:
    """400 for a field that would change the output and that this gateway does not act on; the rest of
    the unknown fields are logged and dropped, as vLLM's server does."""
    unserved = req.unserved_fields()
    if unserved:
        name = unserved[0]
        hint = UNSERVED_HINTS.get(name, "remove it")
        raise bad_request(f"'{name}' is not supported by this gateway; {hint}.", param=name, code="unsupported_parameter")
    ignored = req.ignored_fields()
    if ignored:
        log.warning("The following fields were present in the request but ignored: %s", ignored)


def check_options(engine: EngineClient, options: SamplingOptions, structured_param: str) -> None:
    """What the engine would refuse once streaming started (sampling parameters it rejects, a schema it
    cannot compile, a token id outside the vocabulary) is refused now, as a 400 naming the request field,
    so that an engine error never shows up as a guard cut or a broken stream."""
    try:
        engine.check_options(options)
    except InvalidOptionsError as e:
        param = {"structured": structured_param, "logit_bias": "logit_bias"}.get(e.param or "", e.param)
        raise bad_request(f"Invalid '{param}': {e}" if param else f"Invalid sampling options: {e}", param=param,
                          code="invalid_value") from e


def stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    return tuple(s for s in stop if s)


def check_prompt_len(n_prompt: int, max_tokens: int | None, max_model_len: int) -> None:
    if n_prompt >= max_model_len:
        raise bad_request(str(PromptTooLongError(n_prompt, max_model_len)), param="messages", code="context_length_exceeded")
    if max_tokens is not None and n_prompt + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion). "
            "Please reduce the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )


def choice_options(base: SamplingOptions, i: int) -> SamplingOptions:
    """Choice ``i`` of ``n`` runs as its own engine request, so a guard cut can stop one choice alone.
    With a fixed seed the choices must still differ, hence ``seed + i``."""
    if base.seed is None:
        return base
    return SamplingOptions(**{**_asdict(base), "seed": base.seed + i})


def _asdict(o: SamplingOptions) -> dict[str, Any]:
    return {f: getattr(o, f) for f in o.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class StreamStats:
    """Per-request measurements, recorded into Prometheus by ``gateway.metrics.record``."""

    route: str
    model: str
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cuts: list[SafetyCut] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    disconnected: bool = False
    error: str | None = None
    guard_step: list[float] = field(default_factory=list)   # engine arrival -> guard release, per token delta
    held_back: list[int] = field(default_factory=list)      # per cut choice: tokens received but never sent
    # the guard failed and the policy let the text through unscored (prompt gate or a choice's stream)
    guard_fail_open: list[GuardFailure] = field(default_factory=list)

    def on_tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.itl.append((now - self.last_token_at) / n)
        self.last_token_at = now
        self.completion_tokens += n


@dataclass(frozen=True, slots=True)
class StreamTimeouts:
    """Per-request limits (``ServerSettings``): to the first token, between two tokens, and in total."""

    first_token_s: float = 120.0
    idle_s: float = 60.0
    total_s: float = 600.0
    started: float | None = None     # loop.time() when the request arrived; None = when the choice starts


# Set per request at the edge (``gateway.ops.middleware``) from the server settings. A context variable because the
# serving classes are settings-free and the deadline belongs to the request, not to the engine call.
_DEFAULT_TIMEOUTS = StreamTimeouts()   # frozen, so sharing it as the default is safe
STREAM_TIMEOUTS: ContextVar[StreamTimeouts] = ContextVar("nextguard_stream_timeouts", default=_DEFAULT_TIMEOUTS)


def _timeout_error(kind: str, seconds: float) -> OpenAIError:
    what = {
        "first_token_timeout": "No token was generated within",
        "idle_timeout": "No further token was generated within",
        "request_timeout": "The request did not finish within",
    }[kind]
    return OpenAIError(504, f"{what} {seconds:g} s; retry, or ask for fewer tokens.", type="timeout_error", code=kind)


async def _tap(deltas: AsyncIterator[TokenDelta], arrivals: dict[int, tuple[float, int]]) -> AsyncIterator[TokenDelta]:
    """Note when each engine delta arrives, so the time the guard holds it can be measured on release."""
    async for d in deltas:
        arrivals[id(d)] = (time.perf_counter(), len(d.token_ids))
        yield d
    # (closing this wrapper closes ``deltas`` too: async generators close what they iterate on exit)


async def choice_stream(
    engine: EngineClient,
    guard: StreamGuard | None,
    policy: GuardPolicy,
    prompt_ids: list[int],
    conversation: Conversation,
    options: SamplingOptions,
    request_id: str,
    stats: StreamStats | None = None,
) -> AsyncIterator[Item]:
    """engine deltas → (guard.watch) for one choice. A cut aborts the engine request at once.

    Timeouts come from :data:`STREAM_TIMEOUTS`; one that fires raises a 504 ``OpenAIError`` (an in-stream
    error frame once streaming started) and aborts the engine request. With ``stats`` the guard's per-delta
    delay and, on a cut, the withheld token count are recorded, and so is a guard failure the policy let
    through (fail-open: the guard reports it into :data:`guard.api.FAIL_OPEN_SINK` while we drive it)."""
    deltas = engine.generate(prompt_ids, options, request_id)
    source: AsyncIterator[Item] = deltas
    arrivals: dict[int, tuple[float, int]] = {}
    guarded = guard is not None and policy.enabled
    if guarded:
        assert guard is not None
        source = guard.watch(conversation, _tap(deltas, arrivals) if stats is not None else deltas, policy)
    limits = STREAM_TIMEOUTS.get()
    loop = asyncio.get_running_loop()
    deadline = (limits.started if limits.started is not None else loop.time()) + limits.total_s
    it = source.__aiter__()
    first = True
    fail_open = stats.guard_fail_open if stats is not None else []
    try:
        while True:
            gap_s = limits.first_token_s if first else limits.idle_s
            kind = "first_token_timeout" if first else "idle_timeout"
            if deadline - loop.time() < gap_s:
                gap_s, kind = max(0.0, deadline - loop.time()), "request_timeout"
            # Set around each step only: between our own yields the context belongs to our consumer.
            sink_token = FAIL_OPEN_SINK.set(fail_open)
            try:
                async with asyncio.timeout(gap_s):
                    item = await anext(it)
            except StopAsyncIteration:
                break
            except TimeoutError:
                if stats is not None:
                    stats.error = kind      # counted as gateway_errors_total{stage=<kind>}
                raise _timeout_error(kind, limits.total_s if kind == "request_timeout" else gap_s) from None
            finally:
                FAIL_OPEN_SINK.reset(sink_token)
            first = False
            if isinstance(item, SafetyCut):
                await engine.abort(request_id)
                if stats is not None and guarded:
                    stats.held_back.append(sum(n for _, n in arrivals.values()))
                yield item
                return
            if stats is not None and guarded:
                got = arrivals.pop(id(item), None)
                if got is not None:
                    stats.guard_step.append(time.perf_counter() - got[0])
            yield item
    except EngineError as e:
        raise OpenAIError(500, f"The engine failed while generating: {e}", code="engine_error") from e
    finally:
        # Closing the chain closes vLLM's generator too, which aborts the request if it is still running
        # (client disconnect, cut, or error). Abort explicitly as well: it is idempotent and immediate.
        with contextlib.suppress(Exception):
            await source.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            await engine.abort(request_id)


class StartedChoices:
    """Choice streams set running at once: one task per stream pumps its chain (engine → guard) into one
    queue from the moment this is made, whether or not anyone reads yet. So the prompt gate can score a
    request while its choices already generate and their response gate already reads: what they produce
    waits here until :meth:`items` reads it, and :meth:`aclose` (a refused prompt, any error before the
    response) cancels them, which aborts their engine requests before anything was sent."""

    def __init__(self, streams: Sequence[AsyncIterator[Item]]) -> None:
        self._queue: asyncio.Queue[tuple[int, Item | BaseException | None]] = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._pump(i, s), name=f"nextguard-choice-{i}")
                       for i, s in enumerate(streams)]

    async def _pump(self, i: int, s: AsyncIterator[Item]) -> None:
        try:
            async for item in s:
                self._queue.put_nowait((i, item))
        except BaseException as e:  # forwarded to the consumer, which re-raises it
            self._queue.put_nowait((i, e))
            return
        self._queue.put_nowait((i, None))

    async def items(self) -> AsyncIterator[tuple[int, Item]]:
        """``(choice index, item)`` in arrival order; closing the iterator stops every stream."""
        try:
            remaining = len(self._tasks)
            while remaining:
                i, got = await self._queue.get()
                if got is None:
                    remaining -= 1
                elif isinstance(got, BaseException):
                    raise got
                else:
                    yield i, got
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def merge(streams: Sequence[AsyncIterator[Item]]) -> AsyncIterator[tuple[int, Item]]:
    """Interleave several choice streams as items arrive; one stream needs no task at all."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    async for got in StartedChoices(streams).items():
        yield got


GUARD_OVERRIDE_REFUSED = "guard_override_not_allowed"


def policy_from(
    default: GuardPolicy,
    overrides: Any | None,
    *,
    allow_disable: bool,
    operator_threshold: Callable[[str], float] | None = None,
) -> GuardPolicy:
    """Apply per-request overrides to the tenant/default policy ``default``.

    Overrides may only tighten it. A threshold above the operator's (``operator_threshold(gate)``: what the
    guard applies under ``default``, whether it comes from settings, a budget or the build) or a hold-back
    below ``default.hold_back`` is refused with a 400 naming the field: a looser value would release what
    the operator chose to cut. Without a guard there is nothing to loosen, so the operator threshold is
    then only known when ``default`` sets it. The guard goes off only where ``allow_disable``; otherwise
    ``enabled=false`` is ignored and the request stays guarded."""
    if overrides is None:
        return default
    enabled = default.enabled
    if overrides.enabled is False and allow_disable:
        enabled = False
    thresholds: dict[str, float | None] = {}
    for gate in ("prompt", "response"):
        field_name = f"{gate}_threshold"
        asked = getattr(overrides, field_name)
        operator = getattr(default, field_name)
        if asked is None:
            thresholds[gate] = operator
            continue
        if operator_threshold is not None:
            operator = operator_threshold(gate)
        # ``not <=`` so that NaN is refused as well
        if operator is not None and not asked <= operator:
            raise bad_request(
                f"'guard.{field_name}' may only tighten the operator's {gate} threshold: send at most "
                f"{operator:g} (got {asked:g}), or leave it out.",
                param=f"guard.{field_name}",
                code=GUARD_OVERRIDE_REFUSED,
            )
        thresholds[gate] = asked
    hold_back = default.hold_back
    if overrides.hold_back is not None:
        if overrides.hold_back < default.hold_back:
            raise bad_request(
                f"'guard.hold_back' may only tighten the operator's hold-back: send at least {default.hold_back} "
                f"(got {overrides.hold_back}), or leave it out.",
                param="guard.hold_back",
                code=GUARD_OVERRIDE_REFUSED,
            )
        hold_back = overrides.hold_back
    return GuardPolicy(
        enabled=enabled,
        prompt_threshold=thresholds["prompt"],
        response_threshold=thresholds["response"],
        hold_back=hold_back,
        fail_closed=default.fail_closed,
        categories=default.categories,
    )


def content_filter_error(cut: SafetyCut) -> OpenAIError:
    return OpenAIError(
        400,
        f"The prompt was flagged by the safety guard (category: {cut.category}, score {cut.score:.3f} "
        f">= threshold {cut.threshold:.3f}).",
        type="invalid_request_error",
        param="messages",
        code="content_filter",
        extra={"safety": cut.to_dict()},
    )


class ServingBase:
    """What chat and completions share: the engine, the guard and how a request's guard policy is resolved."""

    def __init__(
        self,
        engine: EngineClient | None,
        guard: StreamGuard | None,
        default_policy: GuardPolicy,
        *,
        allow_guard_disable: bool,
        limits: ServingLimits | None = None,
    ) -> None:
        self.engine = engine
        self.guard = guard
        self.default_policy = default_policy
        self.allow_guard_disable = allow_guard_disable
        self.limits = limits or ServingLimits()

    async def check_prompt(self, conversation: Conversation, policy: GuardPolicy) -> list[GuardFailure]:
        """The prompt gate: raise 400 ``content_filter`` on a cut; return the failures the policy let
        through (fail-open), which the caller adds to the request's :class:`StreamStats`."""
        failures: list[GuardFailure] = []
        if self.guard is None or not policy.enabled:
            return failures
        token = FAIL_OPEN_SINK.set(failures)
        try:
            # Guard slots are fewer than admitted requests: a wait without end would hold the request's
            # admission slot forever. Bounded (here, and by the guard's own slot wait, which shares its slots
            # fairly between tenants), and the caller is told when to come back.
            async with asyncio.timeout(self.limits.guard_wait_s):
                cut = await self.guard.check_prompt(conversation, policy)
        except (TimeoutError, GuardBusy):
            metrics.GUARD_BUSY.labels("prompt").inc()
            raise OpenAIError(
                503,
                "The safety guard is busy and could not take this prompt in time; retry shortly.",
                code="guard_busy",
                headers={"Retry-After": str(max(1, round(self.limits.guard_wait_s / 10)))},
            ) from None
        finally:
            FAIL_OPEN_SINK.reset(token)
        if cut is not None:
            raise content_filter_error(cut)
        return failures

    async def gate(self, conversations: Sequence[Conversation], policy: GuardPolicy,
                   start: Callable[[], Sequence[AsyncIterator[Item]]]) -> tuple[list[GuardFailure], StartedChoices | None]:
        """The prompt gate over ``conversations`` (400 on a cut, 503 when busy), and the failures it let
        through. With ``overlap_prompt_gate`` and a prompt gate to wait for, the choices from ``start`` run
        meanwhile (returned started; their output waits for the caller), so the gate's time hides behind the
        engine's prefill instead of adding to it; on any exception they are stopped before it propagates."""
        started = None
        if self.limits.overlap_prompt_gate and self.guard is not None and policy.enabled:
            started = StartedChoices(start())
        failures: list[GuardFailure] = []
        try:
            for conv in conversations:
                failures += await self.check_prompt(conv, policy)
        except BaseException:
            if started is not None:
                await started.aclose()
            raise
        return failures, started

    def resolve_policy(self, overrides: Any | None, tenant_policy: GuardPolicy | None, allow_disable: bool | None) -> GuardPolicy:
        # the tenant's policy (set by the ops layer from the API key) replaces the deployment default
        base = tenant_policy or self.default_policy
        threshold_of = getattr(self.guard, "threshold", None) if self.guard is not None else None
        return policy_from(
            base,
            overrides,
            allow_disable=self.allow_guard_disable if allow_disable is None else allow_disable,
            # the guard knows the threshold it applies (settings, budget or the build's manifest): ask it
            operator_threshold=None if threshold_of is None else (lambda gate: float(threshold_of(gate, base))),
        )
