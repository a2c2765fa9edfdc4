"""``POST /v1/chat/completions``: request → prompt gate → per-choice chains (engine → guard) → chunks.

Only ``gateway.sse`` turns the chunk objects into bytes."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import OpenAIError, bad_request
from gateway.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChatTokenLogprob,
    ChoiceLogprobs,
    DeltaMessage,
    NamedToolChoice,
    ResponseFormatJSONObject,
    ResponseFormatJSONSchema,
    SafetyInfo,
    TopLogprob,
    Usage,
)
from gateway.serving.common import (
    ServingBase,
    StartedChoices,
    StreamStats,
    check_fields,
    check_model,
    check_options,
    check_prompt_len,
    choice_options,
    choice_stream,
    merge,
    new_id,
    stop_tuple,
)
from gateway.serving.tools import delta_call, tool_call_stage, wire_calls
from guard.api import GuardFailure, GuardPolicy, SafetyCut
from guard.text import Conversation
from inference.engine import EngineClient, InvalidOptionsError
from inference.tool_calls import ToolCallReader, ToolSpec, call_text, tool_spec
from inference.types import SamplingOptions, StructuredOutput, TokenDelta, TokenLogprob
from inference.types import ToolCall as EngineToolCall


@dataclass(slots=True)
class PreparedChat:
    id: str
    created: int
    model: str
    prompt_ids: list[int]
    conversation: Conversation
    options: SamplingOptions
    policy: GuardPolicy
    n: int
    include_usage: bool
    want_logprobs: bool
    include_scores: bool = False
    threshold: float | None = None
    guard_fail_open: list[GuardFailure] = field(default_factory=list)   # prompt gate, failed open
    tools: ToolSpec | None = None       # tool calls are read out of each choice's text
    stats: StreamStats = field(default_factory=lambda: StreamStats(route="chat", model=""))
    started: StartedChoices | None = None   # choices already running (they overlapped the prompt gate)


def guard_conversation(req: ChatCompletionRequest) -> Conversation:
    """Every text the model reads, in order: the tool definitions (the chat template renders them into the
    prompt as JSON, so the guard reads them as that JSON, first, as a system turn), then every message
    (system, developer and tool messages and earlier turns too), formatted by :mod:`guard.text`, the one
    format its monitors were fitted on. Earlier calls are read as the text the model wrote them in, tool
    results as the tool turn's content."""
    turns = tuple((m.role, _turn_text(m)) for m in req.messages)
    if req.tools:
        return (("system", tools_text(req.tools)), *turns)
    return turns


def tools_text(tools: list[Any]) -> str:
    """Tool definitions as chat templates render them: one JSON object per tool, descriptions and every
    parameter's description included, characters as written (not \\u-escaped)."""
    return "\n".join(json.dumps(t.model_dump(exclude_none=True, by_alias=True), ensure_ascii=False) for t in tools)


def _turn_text(m: ChatMessage) -> str:
    calls = "\n".join(call_text(c.function.name, c.function.arguments) for c in m.tool_calls or [])
    text = m.text()
    return f"{text}\n{calls}" if text and calls else text or calls


def structured_output(req: ChatCompletionRequest, tools: ToolSpec | None) -> StructuredOutput | None:
    if tools is not None and tools.schema is not None:
        return StructuredOutput(json_schema=tools.schema)
    rf = req.response_format
    if isinstance(rf, ResponseFormatJSONSchema):
        return StructuredOutput(json_schema=rf.json_schema.schema_)
    if isinstance(rf, ResponseFormatJSONObject):
        return StructuredOutput(json_object=True)
    return None


def engine_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as the engine's chat template takes them: developer turns as system turns; calls and
    the ids that tie results to them kept as OpenAI sends them (the engine renders them for its model)."""
    out: list[dict[str, Any]] = []
    for m in req.messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def chat_logprobs(lps: list[TokenLogprob] | None) -> ChoiceLogprobs | None:
    if lps is None:
        return None
    return ChoiceLogprobs(
        content=[
            ChatTokenLogprob(
                token=lp.token,
                logprob=lp.logprob,
                bytes=list(lp.token.encode()),
                top_logprobs=[TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for _, t, v in lp.top],
            )
            for lp in lps
        ]
    )


class ServingChat(ServingBase):
    def fan_out(self, req: ChatCompletionRequest) -> int:
        """Choices (engine requests) this request asks for; 400 over the deployment's bounds."""
        return self.limits.check_fan_out(1, req.n or 1)

    async def prepare(
        self, req: ChatCompletionRequest, tenant_policy: GuardPolicy | None = None, allow_disable: bool | None = None
    ) -> PreparedChat:
        engine = check_model(self.engine, req.model)
        check_fields(req)
        # overrides first: a refused one costs no tokenising
        policy = self.resolve_policy(req.guard, tenant_policy, allow_disable)
        tools = self._tool_spec(req, engine)
        messages = engine_messages(req)
        n_chars = sum(len(m["content"]) for m in messages)
        render: Any = engine.apply_chat_template
        if tools is not None or any("tool_calls" in m or m["role"] == "tool" for m in messages):
            # only then: a template call without tools stays the plain one every engine double takes
            tool_defs = [t.model_dump(exclude_none=True) for t in req.tools or []] if tools is not None else None
            render = functools.partial(engine.apply_chat_template, tools=tool_defs)
        try:
            prompt_ids = await self.limits.off_loop(n_chars, render, messages)
        except Exception as e:  # template errors are the caller's message shape, not a server fault
            raise bad_request(f"Could not apply the chat template to 'messages': {e}", param="messages") from e
        max_tokens = req.max_completion_tokens or req.max_tokens
        check_prompt_len(len(prompt_ids), max_tokens, engine.model_card.max_model_len)
        want_logprobs = bool(req.logprobs)
        options = SamplingOptions(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=stop_tuple(req.stop),
            n=1,
            logprobs=(req.top_logprobs or 0) if want_logprobs else None,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            structured=structured_output(req, tools),
            logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
        )
        check_options(engine, options, "tools" if tools is not None and tools.schema is not None else "response_format")
        conversation = guard_conversation(req)
        include_scores = bool(req.guard and req.guard.include_scores and self.guard is not None and policy.enabled)
        threshold_fn = getattr(self.guard, "threshold", None)
        p = PreparedChat(
            include_scores=include_scores,
            threshold=threshold_fn("response", policy) if include_scores and threshold_fn is not None else None,
            id=new_id("chatcmpl"),
            created=int(time.time()),
            model=engine.model_card.id,
            prompt_ids=prompt_ids,
            conversation=conversation,
            options=options,
            policy=policy,
            n=req.n or 1,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            want_logprobs=want_logprobs,
            tools=tools,
            stats=StreamStats(route="chat", model=engine.model_card.id),
        )
        p.guard_fail_open, p.started = await self.gate([conversation], policy, lambda: self._streams(p, p.stats))
        return p

    def _choices(self, p: PreparedChat) -> AsyncIterator[tuple[int, TokenDelta | SafetyCut]]:
        """The choices' items: the ones started beside the prompt gate, else started now."""
        return p.started.items() if p.started is not None else merge(self._streams(p, p.stats))

    @staticmethod
    def _tool_spec(req: ChatCompletionRequest, engine: EngineClient) -> ToolSpec | None:
        if not req.tools:
            return None
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedToolChoice) else req.tool_choice
        try:
            return tool_spec([t.model_dump(exclude_none=True) for t in req.tools], choice, req.parallel_tool_calls,
                             engine.model_card.tool_call_parser)
        except InvalidOptionsError as e:
            raise bad_request(str(e), param=e.param or "tools", code="invalid_value") from e

    def _streams(self, p: PreparedChat, stats: StreamStats) -> list[AsyncIterator[TokenDelta | SafetyCut]]:
        assert self.engine is not None
        streams = [
            choice_stream(
                self.engine,
                self.guard,
                p.policy,
                p.prompt_ids,
                p.conversation,
                choice_options(p.options, i),
                f"{p.id}-{i}",
                stats,
            )
            for i in range(p.n)
        ]
        if p.tools is None:
            return streams
        tokenizer = self.engine.tokenizer
        return [tool_call_stage(s, ToolCallReader(p.tools, tokenizer)) for s in streams]

    async def stream(self, p: PreparedChat) -> AsyncIterator[ChatCompletionChunk]:
        """Chunk objects for one streamed request (role first, content, finish, optional usage)."""
        stats = p.stats
        stats.prompt_tokens = len(p.prompt_ids)
        stats.guard_fail_open.extend(p.guard_fail_open)

        def chunk(choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=p.id, created=p.created, model=p.model, choices=choices)

        for i in range(p.n):
            yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))])
        async for i, item in self._choices(p):
            if isinstance(item, SafetyCut):
                stats.cuts.append(item)
                stats.finish_reasons.append("content_filter")
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=i, delta=DeltaMessage(), finish_reason="content_filter", safety=SafetyInfo(**item.to_dict())
                        )
                    ]
                )
                continue
            stats.on_tokens(len(item.token_ids))
            finish = _finish(item, p.tools)
            if finish:
                stats.finish_reasons.append(finish)
            calls = item.tool_calls or []
            # a delta can carry tokens without text (an incomplete UTF-8 sequence); it still goes out when it
            # carries something the client asked for (logprobs, per-token risk)
            if item.text or (finish and not calls) or (p.want_logprobs and item.logprobs) or (p.include_scores and item.scores):
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=i,
                            delta=DeltaMessage(content=item.text) if item.text else DeltaMessage(),
                            logprobs=chat_logprobs(item.logprobs) if p.want_logprobs else None,
                            finish_reason=None if calls else finish,  # type: ignore[arg-type]
                            risk=item.scores if p.include_scores else None,
                            threshold=p.threshold if p.include_scores else None,
                        )
                    ]
                )
            for k, call in enumerate(calls):
                last = k == len(calls) - 1
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=i,
                            delta=DeltaMessage(tool_calls=[delta_call(k, call)]),
                            finish_reason=finish if last else None,  # type: ignore[arg-type]
                        )
                    ]
                )
        if p.include_usage:
            u = Usage(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                total_tokens=stats.prompt_tokens + stats.completion_tokens,
            )
            yield ChatCompletionChunk(id=p.id, created=p.created, model=p.model, choices=[], usage=u)

    async def complete(self, p: PreparedChat) -> ChatCompletion:
        stats = p.stats
        stats.prompt_tokens = len(p.prompt_ids)
        stats.guard_fail_open.extend(p.guard_fail_open)
        texts = [""] * p.n
        calls: list[list[EngineToolCall]] = [[] for _ in range(p.n)]
        lps: list[list[TokenLogprob]] = [[] for _ in range(p.n)]
        finish: list[str | None] = [None] * p.n
        safety: list[SafetyInfo | None] = [None] * p.n
        async for i, item in self._choices(p):
            if isinstance(item, SafetyCut):
                stats.cuts.append(item)
                finish[i] = "content_filter"
                safety[i] = SafetyInfo(**item.to_dict())
                continue
            stats.on_tokens(len(item.token_ids))
            texts[i] += item.text
            calls[i].extend(item.tool_calls or [])
            if item.logprobs:
                lps[i].extend(item.logprobs)
            if item.finish_reason:
                finish[i] = _finish(item, p.tools)
        stats.finish_reasons.extend(f for f in finish if f)
        choices = [
            ChatChoice(
                index=i,
                message=AssistantMessage(
                    content=texts[i] if texts[i] or not calls[i] else None,
                    tool_calls=wire_calls(calls[i]) or None,
                ),
                logprobs=chat_logprobs(lps[i]) if p.want_logprobs else None,
                finish_reason=finish[i] or "stop",  # type: ignore[arg-type]
                safety=safety[i],
            )
            for i in range(p.n)
        ]
        usage = Usage(
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.completion_tokens,
            total_tokens=stats.prompt_tokens + stats.completion_tokens,
        )
        return ChatCompletion(id=p.id, created=p.created, model=p.model, choices=choices, usage=usage)


def _finish(item: TokenDelta, tools: ToolSpec | None = None) -> str | None:
    if item.finish_reason is None:
        return None
    if item.finish_reason == "stop" and item.tool_calls and tools is not None and tools.mode != "named":
        # as OpenAI: "tool_calls" where the model chose to call (auto, required), "stop" for a named function
        return "tool_calls"
    if item.finish_reason in ("stop", "length"):
        return item.finish_reason
    # We stop reading a choice before our own aborts (cut, disconnect) can surface here, so an "abort" or
    # "error" is the engine's doing: report it as an error rather than invent a finish reason.
    raise OpenAIError(500, f"The engine ended the request early ({item.finish_reason}).", code="engine_error")
