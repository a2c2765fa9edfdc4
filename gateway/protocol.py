"""OpenAI wire models. Field names and order follow the OpenAI API reference; our additions sit in one
fenced block per class (``# --- nextguard extensions ---``).

Reference: https://platform.openai.com/docs/api-reference/chat and .../completions, .../models,
.../moderations.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

log = logging.getLogger(__name__)

# A sampling seed is a signed 64-bit integer (OpenAI's and vLLM's generators); a larger one would fail inside
# the engine once the stream had started.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def _check_min_tokens(min_tokens: int, max_tokens: int | None) -> None:
    if max_tokens is not None and min_tokens > max_tokens:
        raise ValueError(f"'min_tokens' ({min_tokens}) must be at most 'max_tokens' ({max_tokens})")


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
    # Unknown request fields are accepted (clients send vendor extras) but never acted upon; request models
    # log them (:meth:`RequestBase.ignored_fields`) and refuse the ones that would change the output.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# Request fields vLLM's OpenAI server acts on and this gateway does not. A client that sends one expects
# it to change the output, so it is refused with a 400 naming it rather than dropped; ``test_protocol``
# keeps this list in step with vLLM's own request models.
VLLM_ONLY_FIELDS = frozenset({
    "add_generation_prompt", "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt",
    "chat_template", "chat_template_kwargs", "continue_final_message", "documents", "ec_transfer_params", "echo",
    "include_reasoning", "include_stop_str_in_output", "kv_transfer_params", "length_penalty",
    "logits_processors", "logprob_token_ids", "media_io_kwargs", "min_p", "mm_payload", "mm_processor_kwargs",
    "priority", "prompt_embeds", "prompt_logprobs", "reasoning_effort", "repetition_detection",
    "repetition_penalty", "request_id", "response_format", "return_mm_kwargs", "return_prompt_text",
    "return_token_ids", "return_token_offsets", "return_tokens_as_token_ids", "routed_experts_prompt_start",
    "session_id", "skip_special_tokens", "spaces_between_special_tokens", "stop_token_ids", "stream_interval",
    "structured_outputs", "thinking_token_budget", "top_k", "truncate_prompt_tokens", "truncation_side",
    "use_beam_search", "vllm_xargs", "watermarking",
    # names older vLLM servers took for structured outputs
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern",
})
# OpenAI fields that would change the output and that this gateway does not serve.
OPENAI_UNSERVED_FIELDS = frozenset({
    "audio", "functions", "function_call", "modalities", "prediction", "web_search_options", "verbosity",
})
UNSERVED_HINTS = {
    "functions": "send 'tools' instead",
    "function_call": "send 'tool_choice' instead",
    "guided_json": "send response_format {'type': 'json_schema', ...} instead",
    "structured_outputs": "send response_format {'type': 'json_schema', ...} instead",
}


def _find_lone_surrogate(v: Any, path: str = "") -> str | None:
    """The path of the first string holding a lone surrogate (JSON's "\\ud800" decodes to one), which no
    tokenizer can read; None when every string is valid Unicode."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(v, dict):
        items: Any = v.items()
    elif isinstance(v, list):
        items = enumerate(v)
    else:
        return None
    for k, x in items:
        found = _find_lone_surrogate(x, f"{path}.{k}" if path else str(k))
        if found is not None:
            return found
    return None


class ValidUnicode(BaseModel):
    """Top-level request models: a lone surrogate anywhere in the body is a 400 naming the field."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _find_lone_surrogate(data)
        if where is not None:
            raise ValueError(f"'{where}' is not valid Unicode (it holds a lone surrogate)")
        return data


class RequestBase(ValidUnicode, OpenAIBaseModel):
    """What request models share: the fields sent that this gateway will not act on."""

    def unserved_fields(self) -> list[str]:
        """Extra fields that would change the output (vLLM's or OpenAI's): the caller refuses them."""
        return sorted(k for k in (self.model_extra or {}) if k in VLLM_ONLY_FIELDS | OPENAI_UNSERVED_FIELDS)

    def ignored_fields(self) -> list[str]:
        """Extra fields that change nothing here (vendor metadata): logged, as vLLM does, and dropped."""
        return sorted(k for k in (self.model_extra or {}) if k not in VLLM_ONLY_FIELDS | OPENAI_UNSERVED_FIELDS)


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

    # Ours, not OpenAI's: no client sends vendor extras here, and a misspelt policy field silently ignored
    # would leave the caller believing a policy is in force that is not.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


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
    # the trigger that crossed: "readout" (the SAE latents in ``features``), "residual_probe" (the response gate's
    # probe alone) or "combined" (the prompt gate's read-out plus its residual probe)
    trigger: str = "readout"


# ---------------------------------------------------------------------------------------------
# chat completions — https://platform.openai.com/docs/api-reference/chat/create
class ContentPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str


class ToolCall(OpenAIBaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None      # assistant turns
    # tool turns: the call this result answers (optional, as in vLLM: a template without tool support
    # does not use it)
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"'tool_calls' is only allowed on assistant messages, not on '{self.role}' messages")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDefinition(OpenAIBaseModel):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("a function's 'parameters' must be a JSON schema of type 'object'")
        return v


class ChatTool(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormatText(OpenAIBaseModel):
    type: Literal["text"]


class ResponseFormatJSONObject(OpenAIBaseModel):
    type: Literal["json_object"]


class JSONSchemaFormat(OpenAIBaseModel):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    # ``schema`` would shadow BaseModel.schema(); the wire name is kept through the alias
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormatJSONSchema(OpenAIBaseModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema, Field(discriminator="type")
]


def _check_logit_bias(v: dict[str, float] | None) -> dict[str, float] | None:
    for k, bias in (v or {}).items():
        try:
            int(k)
        except ValueError:
            raise ValueError(f"'logit_bias' keys are token ids (integers as strings); got '{k}'") from None
        if not -100 <= bias <= 100:
            raise ValueError(f"'logit_bias' values must be between -100 and 100; got {bias} for token {k}")
    return v


class ChatCompletionRequest(RequestBase):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1, le=16)
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    response_format: ResponseFormat | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=1.0, ge=0, le=2)
    top_p: float | None = Field(default=1.0, gt=0, le=1)
    tools: list[ChatTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    user: str | None = None
    # --- nextguard extensions ---
    guard: GuardOverrides | None = Field(default=None, description="Per-request guard policy overrides.")
    ignore_eos: bool = Field(default=False, description="Keep generating past end-of-sequence (benchmarks).")
    min_tokens: int = Field(default=0, ge=0)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        return _check_stop(v)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return _check_logit_bias(v)

    @field_validator("response_format", mode="wrap")
    @classmethod
    def _response_format(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # one error naming the sub-field, without the union's tag that pydantic puts in the path
        try:
            return handler(v)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"][1:])
            raise ValueError(f"{where + ': ' if where else ''}{err['msg']}") from None

    @model_validator(mode="after")
    def _checks(self) -> ChatCompletionRequest:
        _check_min_tokens(self.min_tokens, self.max_completion_tokens or self.max_tokens)
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("'top_logprobs' requires 'logprobs' to be true")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("'tool_choice' is only allowed when 'tools' are specified")
        if self.parallel_tool_calls is not None and not self.tools:
            raise ValueError("'parallel_tool_calls' is only allowed when 'tools' are specified")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("function names in 'tools' must be unique")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(
                f"'tool_choice' names the function '{self.tool_choice.function.name}', which is not in 'tools' "
                f"(available: {', '.join(names)})"
            )
        if self.json_output() and self.tools and self.tool_choice != "none":
            # both constrain the same output; one constraint per request
            raise ValueError("'response_format' of type json_object or json_schema cannot be combined with "
                             "'tools' (unless 'tool_choice' is 'none')")
        return self

    def json_output(self) -> bool:
        return isinstance(self.response_format, ResponseFormatJSONObject | ResponseFormatJSONSchema)


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
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _null_content(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # responses are dumped without None fields, but OpenAI sends `"content": null` beside tool calls
        out: dict[str, Any] = handler(self)
        out.setdefault("content", None)
        return out


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


class DeltaFunctionCall(OpenAIBaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(OpenAIBaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(OpenAIBaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


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
class CompletionRequest(RequestBase):
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
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
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

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return _check_logit_bias(v)

    @model_validator(mode="after")
    def _checks(self) -> CompletionRequest:
        _check_min_tokens(self.min_tokens, self.max_tokens)
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
class ModerationRequest(ValidUnicode, OpenAIBaseModel):
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
class GuardScoreRequest(ValidUnicode, OpenAIBaseModel):
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
