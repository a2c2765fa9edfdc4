"""The engine client protocol: the one door through which the gateway, the guard and the suites reach
a generating model. The production implementation is :class:`inference.vllm_engine.VLLMEngineClient`
(vLLM's in-process ``AsyncLLM``); test doubles live under ``tests/``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from inference.types import ModelCard, SamplingOptions, TokenDelta


class EngineError(RuntimeError):
    """The engine failed while serving a request (raised from ``generate``)."""


class InvalidOptionsError(ValueError):
    """The engine refuses these sampling options (a schema it cannot compile, a token id outside the
    vocabulary). ``param`` names what is wrong in the options' terms: ``structured``, ``logit_bias``, …"""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(ValueError):
    """The prompt plus requested tokens do not fit the model context."""

    def __init__(self, n_prompt: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. "
            f"However, your prompt has {n_prompt} tokens. Please shorten the prompt."
        )
        self.n_prompt = n_prompt
        self.max_model_len = max_model_len


@runtime_checkable
class EngineClient(Protocol):
    """Async, per-token access to a generating model."""

    @property
    def model_card(self) -> ModelCard: ...

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``encode``/``decode``/``apply_chat_template``)."""
        ...

    @property
    def ready(self) -> bool: ...

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Render chat messages with the model's chat template and tokenize them. ``tools`` (OpenAI function
        tools) reach the model through the template, or, where it has no tool support, through a system
        prompt in the format the model card's tool-call parser reads back (:mod:`inference.tool_calls`)."""
        ...

    def check_options(self, options: SamplingOptions) -> None:
        """Raise :class:`InvalidOptionsError` where ``generate`` would refuse ``options``, so that a caller
        can refuse a request before it starts streaming."""
        ...

    def generate(self, prompt_token_ids: list[int], options: SamplingOptions, request_id: str) -> AsyncIterator[TokenDelta]:
        """Stream deltas for every choice (``options.n``) until each has a ``finish_reason``."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request early and free its engine slot (idempotent)."""
        ...

    def num_running(self) -> int:
        """Requests currently inside the engine (running or waiting)."""
        ...

    async def shutdown(self) -> None: ...
