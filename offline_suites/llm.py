"""How suites reach the served model: one small synchronous :class:`LLMClient` protocol, two doors.

* :class:`EngineLLMClient` drives an in-process :class:`inference.engine.EngineClient` (a worker
  co-located with the engine). Suites run in a worker thread; the engine lives on an asyncio loop,
  so calls are bridged with ``run_coroutine_threadsafe``.
* :class:`OpenAILLMClient` talks to the gateway's public OpenAI API (``openai`` SDK with
  ``base_url``), so a remote worker sees exactly what clients see, guard included.

Both expose the two things the suites need: chat generation (with OpenAI function tools: the model's
calls come back in :attr:`ChatReply.tool_calls`) and the log-likelihood of candidate continuations
(multiple-choice cloze scoring, as lm-eval's ``loglikelihood``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from inference.engine import EngineClient
    from offline_suites.config import SuiteSettings

T = TypeVar("T")


class ContextTooLong(ValueError):
    """The prompt does not fit the served model's context (either door). A suite can shorten the
    conversation or end it; it is not a failure of the run."""


@dataclass(slots=True)
class ChatReply:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    # calls the model made when it was offered ``tools``, in the OpenAI message shape
    # ({"id", "type": "function", "function": {"name", "arguments"}}), ready to append to the conversation
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@runtime_checkable
class LLMClient(Protocol):
    @property
    def model_id(self) -> str: ...

    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0,
             seed: int | None = None, stop: Sequence[str] = (),
             tools: Sequence[dict[str, Any]] | None = None) -> ChatReply:
        """One reply; with ``tools`` (OpenAI function tools) the model may call them (``tool_choice`` auto)."""
        ...

    def chat_many(self, conversations: Sequence[Sequence[dict[str, Any]]], *, max_tokens: int,
                  temperature: float = 0.0, seed: int | None = None, stop: Sequence[str] = ()) -> list[ChatReply]:
        """Several independent chats, in flight together (the engine batches them)."""
        ...

    def continuation_logprobs(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        """Sum of log p(continuation tokens | prompt) per continuation (raw text, no chat template)."""
        ...

    def score_many(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """log p(continuation | prompt) for several different prompts, all in flight together (the
        engine batches them), one value per (prompt, continuation) pair."""
        ...


class EngineLLMClient:
    """LLMClient over an in-process EngineClient running on ``loop`` (another thread's loop)."""

    _ids = itertools.count()

    def __init__(self, engine: EngineClient, loop: asyncio.AbstractEventLoop, timeout_s: float = 600.0) -> None:
        self.engine = engine
        self.loop = loop
        self.timeout_s = timeout_s

    @property
    def model_id(self) -> str:
        return self.engine.model_card.id

    def describe(self) -> dict[str, Any]:
        """For provenance: which door the run used to reach the model."""
        return {"door": "engine", "client": type(self).__name__, "engine": type(self.engine).__name__,
                "model_id": self.model_id, "guarded": False}

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError("EngineLLMClient must be called from a worker thread, not from the engine's loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    def _rid(self, kind: str) -> str:
        return f"suite-{kind}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

    async def _chat(self, messages: Sequence[dict[str, Any]], max_tokens: int, temperature: float,
                    seed: int | None, stop: Sequence[str], tools: Sequence[dict[str, Any]] | None = None) -> ChatReply:
        from inference.engine import PromptTooLongError
        from inference.types import SamplingOptions

        # the engine decides how tools, calls and tool results reach the model's template
        ids = self.engine.apply_chat_template(list(messages), add_generation_prompt=True, tools=tools)
        opts = SamplingOptions(max_tokens=max_tokens, temperature=temperature, seed=seed, stop=tuple(stop))
        parts: list[str] = []
        n_out, finish = 0, None
        try:
            async for delta in self.engine.generate(ids, opts, self._rid("chat")):
                parts.append(delta.text)
                n_out += len(delta.token_ids)
                finish = delta.finish_reason or finish
        except PromptTooLongError as e:
            raise ContextTooLong(str(e)) from e
        text, calls, reason = "".join(parts), [], str(finish) if finish else None
        if tools:
            # the served model's calls, read back as the gateway reads them (vLLM's tool parser)
            from inference.tool_calls import ToolCallReader, tool_spec

            spec = tool_spec(list(tools), "auto", None, self.engine.model_card.tool_call_parser)
            assert spec is not None
            reader = ToolCallReader(spec, self.engine.tokenizer)
            content = reader.feed(text)
            rest, found = reader.finish()
            text = content + rest
            calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                     for c in found]
            reason = "tool_calls" if calls and finish == "stop" else reason
        return ChatReply(text, reason, len(ids), n_out, calls)

    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0,
             seed: int | None = None, stop: Sequence[str] = (),
             tools: Sequence[dict[str, Any]] | None = None) -> ChatReply:
        return self._call(self._chat(messages, max_tokens, temperature, seed, stop, tools))

    def chat_many(self, conversations: Sequence[Sequence[dict[str, Any]]], *, max_tokens: int,
                  temperature: float = 0.0, seed: int | None = None, stop: Sequence[str] = ()) -> list[ChatReply]:
        async def all_() -> list[ChatReply]:
            return list(await asyncio.gather(*(self._chat(m, max_tokens, temperature, seed, stop)
                                               for m in conversations)))
        return self._call(all_())

    async def _loglik(self, prompt_ids: list[int], full_ids: list[int]) -> float:
        from inference.types import SamplingOptions

        # Where the continuation starts: the longest common prefix, because BPE may merge the
        # last prompt characters with the first continuation characters.
        start = 0
        while start < min(len(prompt_ids), len(full_ids)) and prompt_ids[start] == full_ids[start]:
            start += 1
        start = max(start, 1)   # the first prompt token has no logprob
        opts = SamplingOptions(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        plp = None
        async for delta in self.engine.generate(full_ids, opts, self._rid("ll")):
            if delta.prompt_logprobs is not None and plp is None:
                plp = delta.prompt_logprobs
        if plp is None:
            raise RuntimeError("engine returned no prompt_logprobs (needed for continuation scoring)")
        total = 0.0
        for pos in range(start, len(full_ids)):
            lp = plp[pos]
            if lp is None:
                raise RuntimeError(f"missing prompt logprob at position {pos}")
            total += lp.logprob
        return total

    def continuation_logprobs(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        tok = self.engine.tokenizer
        p_ids = list(tok.encode(prompt, add_special_tokens=False))

        async def all_() -> list[float]:
            return list(await asyncio.gather(*(
                self._loglik(p_ids, list(tok.encode(prompt + c, add_special_tokens=False)))
                for c in continuations)))
        return self._call(all_())

    def score_many(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        tok = self.engine.tokenizer

        async def all_() -> list[float]:
            # one gather: every request reaches the engine's scheduler in the same loop turn
            return list(await asyncio.gather(*(
                self._loglik(list(tok.encode(p, add_special_tokens=False)),
                             list(tok.encode(p + c, add_special_tokens=False))) for p, c in pairs)))
        return self._call(all_())


class OpenAILLMClient:
    """LLMClient over the gateway's public OpenAI API (chat completions + completions echo/logprobs)."""

    def __init__(self, base_url: str, api_key: str = "EMPTY", model: str | None = None,
                 timeout_s: float = 600.0, concurrency: int = 4, tenant: str | None = None) -> None:
        import openai

        from offline_suites.config import TENANT_HEADER

        # ``tenant``: call as that tenant (``api_key`` is then the operator key; see TENANT_HEADER)
        headers = {TENANT_HEADER: tenant} if tenant is not None else None
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=2,
                                     default_headers=headers)
        self._model = model
        self._concurrency = concurrency
        self._base_url, self._tenant = base_url, tenant

    def describe(self) -> dict[str, Any]:
        """For provenance: which door the run used to reach the model (the gateway, as which tenant)."""
        return {"door": "api", "client": type(self).__name__, "base_url": self._base_url, "tenant": self._tenant,
                "model_id": self.model_id, "guarded": True}

    @property
    def model_id(self) -> str:
        if self._model is None:
            self._model = next(iter(self._client.models.list())).id
        return self._model

    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0,
             seed: int | None = None, stop: Sequence[str] = (),
             tools: Sequence[dict[str, Any]] | None = None) -> ChatReply:
        import openai

        extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
        try:
            r = self._client.chat.completions.create(
                model=self.model_id, messages=list(messages), max_tokens=max_tokens,  # type: ignore[arg-type]
                temperature=temperature, seed=seed, stop=list(stop) or None, **extra)
        except openai.BadRequestError as e:
            if e.code == "context_length_exceeded":
                raise ContextTooLong(str(e)) from e
            raise
        c = r.choices[0]
        usage = r.usage
        calls = [{"id": t.id, "type": "function", "function": {"name": t.function.name, "arguments": t.function.arguments}}
                 for t in c.message.tool_calls or [] if t.type == "function"]
        return ChatReply(c.message.content or "", c.finish_reason,
                         usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0, calls)

    def chat_many(self, conversations: Sequence[Sequence[dict[str, Any]]], *, max_tokens: int,
                  temperature: float = 0.0, seed: int | None = None, stop: Sequence[str] = ()) -> list[ChatReply]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self._concurrency) as pool:
            return list(pool.map(lambda m: self.chat(m, max_tokens=max_tokens, temperature=temperature,
                                                     seed=seed, stop=stop), conversations))

    def _loglik(self, prompt: str, cont: str) -> float:
        # echo + logprobs + max_tokens=0 returns the prompt's own token logprobs (lm-eval's recipe)
        r = self._client.completions.create(model=self.model_id, prompt=prompt + cont, echo=True,
                                            logprobs=0, max_tokens=0, temperature=0.0)
        lp = r.choices[0].logprobs
        if lp is None or lp.token_logprobs is None or lp.text_offset is None:
            raise RuntimeError("gateway /v1/completions returned no echo logprobs")
        # a token counts for the continuation when its span ends past the prompt, so a token BPE
        # merged across the boundary is included — the same cut the engine client makes by prefix
        offs = list(lp.text_offset)
        ends = offs[1:] + [len(prompt + cont)]
        return float(sum(v for end, v in zip(ends, lp.token_logprobs, strict=False)
                         if end > len(prompt) and v is not None))

    def continuation_logprobs(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self._concurrency) as pool:
            return list(pool.map(lambda c: self._loglik(prompt, c), continuations))

    def score_many(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(self._concurrency, len(pairs))) as pool:
            return list(pool.map(lambda pc: self._loglik(pc[0], pc[1]), pairs))


class BackgroundEngine:
    """An EngineClient driven from its own event-loop thread, for in-process CLI runs and tests.

    ``factory`` builds the engine (blocking, e.g. ``VLLMEngineClient.from_settings``); it runs in the
    calling thread, and every request then runs on the background loop.
    """

    def __init__(self, factory: Callable[[], EngineClient]) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="suite-engine-loop", daemon=True)
        self._thread.start()
        self.engine = factory()

    def client(self) -> EngineLLMClient:
        return EngineLLMClient(self.engine, self.loop)

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.engine.shutdown(), self.loop).result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


def build_openai_client(settings: SuiteSettings, tenant: str | None = None) -> OpenAILLMClient:
    return OpenAILLMClient(settings.api_base_url, settings.api_key, settings.api_model, tenant=tenant)
