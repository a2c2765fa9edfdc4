"""Engine-facing data types shared by the gateway, the guard and the offline suites.

These are plain dataclasses: the engine layer knows nothing about HTTP or safety policy, and
everything above it (gateway, guard, suites) speaks in these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on what the engine may generate (vLLM's structured outputs): a JSON schema the output
    must match, or any JSON object. Exactly one is set."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if (self.json_schema is not None) == self.json_object:
            raise ValueError("a StructuredOutput sets exactly one of 'json_schema' and 'json_object'")


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Sampling knobs the gateway maps from the OpenAI request (names follow OpenAI where they exist)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: int | None = None          # number of top logprobs per generated token (0 = chosen only)
    prompt_logprobs: int | None = None   # for completions echo+logprobs (lm-eval loglikelihood)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    min_tokens: int = 0
    structured: StructuredOutput | None = None
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit at every step


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()   # (token_id, token text, logprob), best first


@dataclass(slots=True)
class TokenDelta:
    """New output of one choice since the previous delta.

    ``token_ids`` and ``text`` are the increment (DELTA output kind). ``finish_reason`` is set on the
    last delta of a choice. ``prompt_token_ids`` and ``prompt_logprobs`` ride on the first delta only.
    """

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_prompt_tokens: int | None = None
    # Per-token scores a downstream monitor attached to exactly these tokens (same order); the engine
    # never sets it. Lets clients see why a stream was (or was not) cut.
    scores: list[float] | None = None
    # Complete tool calls that a downstream tool-call stage found in the text of these tokens (then ``text``
    # is only the text outside the calls); the engine never sets it.
    tool_calls: list[ToolCall] | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model made: its name and its arguments as JSON text (as OpenAI sends them)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What the engine serves: the id clients pass as ``model`` and its limits."""

    id: str
    root: str                      # the local folder or hub id the weights came from
    max_model_len: int
    created: int
    owned_by: str = "nextguard"
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # vLLM tool parser (``--tool-call-parser`` name) that reads this model's calls back out of its text
    tool_call_parser: str = "hermes"
