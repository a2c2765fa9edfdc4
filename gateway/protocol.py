"""OpenAI wire models. Field names and order follow the OpenAI API reference; our additions sit in one
fenced block per class (``# --- nextguard extensions ---``).

Reference: https://platform.openai.com/docs/api-reference/chat and .../completions, .../models,
.../moderations.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Each stop string is matched against the text at every step: a long one is the caller's cost paid by all.
MAX_STOP_CHARS = 256


def _check_stop(v: str | list[str] | None) -> str | list[str] | None:
    if isinstance(v, list) and len(v) > 4:
        raise ValueError("'stop' accepts at most 4 sequences")
    for s in [v] if isinstance(v, str) else v or []:
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"each 'stop' sequence may be at most {MAX_STOP_CHARS} characters")
    return v


class OpenAIBaseModel(BaseModel):
    # Unknown request fields are accepted (clients send vendor extras) but never acted upon.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# ---------------------------------------------------------------------------------------------
# errors
class ErrorBody(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    # --- nextguard extensions ---
    safety: dict[str, Any] | None = Field(default=None, description="Set when the prompt gate refused the request.")


class ErrorResponse(OpenAIBaseModel):
    error: ErrorBody


# ---------------------------------------------------------------------------------------------
# shared
class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class GuardOverrides(OpenAIBaseModel):
    """Per-request guard policy. It may only tighten the operator's policy for the caller's tenant: a
    threshold at most the operator's, a hold-back at least the operator's; anything looser is a 400 naming
    the field. ``enabled=false`` takes effect only for a tenant the operator granted it."""

    enabled: bool | None = Field(
        default=None, description="false switches the guard off, where the operator allows it for the tenant."
    )
    # guard scores are pooled read-outs with a bias, so a threshold may be any finite number
    prompt_threshold: float | None = Field(
        default=None, allow_inf_nan=False, description="At most the operator's prompt threshold."
    )
    response_threshold: float | None = Field(
        default=None, allow_inf_nan=False, description="At most the operator's response threshold."
    )
    hold_back: int | None = Field(default=None, ge=1, le=64, description="At least the operator's hold-back.")
    include_scores: bool = Field(default=False, description="Attach per-token `risk` scores to streamed choices.")


class Usage(OpenAIBaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SafetyInfo(OpenAIBaseModel):
    """The ``safety`` extension object attached to a cut choice (and to a prompt refusal)."""

    category: str
    score: float
    threshold: float
    token_offset: int
    features: list[dict[str, Any]] = Field(default_factory=list)
    gate: str = "response"
    char_offset: int | None = None
    decision: str = "intervened"


# ---------------------------------------------------------------------------------------------
# chat completions — https://platform.openai.com/docs/api-reference/chat/create
class ContentPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(OpenAIBaseModel):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1, le=16)
    presence_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    response_format: dict[str, Any] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=1.0, ge=0, le=2)
    top_p: float | None = Field(default=1.0, gt=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    user: str | None = None
    # --- nextguard extensions ---
    guard: GuardOverrides | None = Field(default=None, description="Per-request guard policy overrides.")
    ignore_eos: bool = Field(default=False, description="Keep generating past end-of-sequence (benchmarks).")
    min_tokens: int = Field(default=0, ge=0)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        return _check_stop(v)

    @model_validator(mode="after")
    def _checks(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("'top_logprobs' requires 'logprobs' to be true")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError("only response_format {'type': 'text'} is supported")
        if self.tools:
            raise ValueError("'tools' are not supported by this deployment")
        return self


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(OpenAIBaseModel):
    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(OpenAIBaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class ChatChoice(OpenAIBaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter", "tool_calls"] | None
    # --- nextguard extensions ---
    safety: SafetyInfo | None = None


class ChatCompletion(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class DeltaMessage(OpenAIBaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter", "tool_calls"] | None = None
    # --- nextguard extensions ---
    safety: SafetyInfo | None = None
    risk: list[float] | None = Field(default=None, description="Guard score per token of this delta (include_scores).")
    threshold: float | None = Field(default=None, description="Response-gate threshold in force (include_scores).")


class ChatCompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# ---------------------------------------------------------------------------------------------
# legacy completions — https://platform.openai.com/docs/api-reference/completions/create
class CompletionRequest(OpenAIBaseModel):
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    echo: bool | None = False
    frequency_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=16, ge=0)
    n: int | None = Field(default=1, ge=1, le=16)
    presence_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = Field(default=1.0, ge=0, le=2)
    top_p: float | None = Field(default=1.0, gt=0, le=1)
    user: str | None = None
    # --- nextguard extensions ---
    guard: GuardOverrides | None = Field(default=None, description="Per-request guard policy overrides.")
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _checks(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("'prompt' must not be empty")
        if self.best_of not in (None, 1) and self.best_of != self.n:
            raise ValueError("'best_of' other than 'n' is not supported")
        if self.suffix:
            raise ValueError("'suffix' is not supported by this model")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("'max_tokens' may be 0 only together with 'echo'")
        return self

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        return _check_stop(v)


class CompletionLogprobs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(OpenAIBaseModel):
    finish_reason: Literal["stop", "length", "content_filter"] | None
    index: int
    logprobs: CompletionLogprobs | None = None
    text: str
    # --- nextguard extensions ---
    safety: SafetyInfo | None = None


class Completion(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# ---------------------------------------------------------------------------------------------
# models — https://platform.openai.com/docs/api-reference/models
class ModelObject(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # --- nextguard extensions ---
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


# ---------------------------------------------------------------------------------------------
# moderations — https://platform.openai.com/docs/api-reference/moderations
class ModerationRequest(OpenAIBaseModel):
    input: str | list[str]
    model: str | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not v:
            raise ValueError("'input' must not be empty")
        if isinstance(v, list) and len(v) > 32:
            raise ValueError("'input' accepts at most 32 texts per request")
        return v


class ModerationResult(OpenAIBaseModel):
    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]


class ModerationResponse(OpenAIBaseModel):
    id: str
    model: str
    results: list[ModerationResult]


# ---------------------------------------------------------------------------------------------
# --- nextguard extensions: guard scoring (not part of the OpenAI API) ---
class GuardScoreRequest(OpenAIBaseModel):
    """Score a prompt (a single user turn) or a whole conversation (``messages``, as in chat completions),
    and optionally a response to it, exactly as the stream's guard reads them."""

    prompt: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    response: str | None = None

    @model_validator(mode="after")
    def _one_input(self) -> GuardScoreRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' and 'messages'")
        return self


class GuardCut(OpenAIBaseModel):
    token_offset: int
    char_offset: int
    score: float
    category: str
    features: list[dict[str, Any]]


class GuardScoreResponse(OpenAIBaseModel):
    tokens: list[str]
    scores: list[float]
    threshold: float
    cut: GuardCut | None = None
