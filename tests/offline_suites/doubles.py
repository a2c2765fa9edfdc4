"""Test double for the EngineClient protocol with the two things suites need: deterministic chat
generation and prompt logprobs. Used when the real vLLM engine is not available or not wanted
(``NEXTGUARD_TEST_SUITES_ENGINE=double``)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from inference.types import ModelCard, SamplingOptions, TokenDelta, TokenLogprob
from tests.doubles import CharTokenizer

_WORDS = (["Once", "upon", "a", "time", "there", "was", "a", "nurse", "named", "Mary", "who", "lived", "by", "the", "sea", "."] +
          ["Action:", "list_folder", "{}", "Final", "Answer:", "42", "North", "rose"])


def _h(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


class HashEngine:
    """Char-level 'model': logprob of token t after prefix p is a fixed hash of (p, t); generation
    picks words by hashing the prompt and seed. Deterministic, fast, and order-independent."""

    def __init__(self) -> None:
        self.requests = 0

    @property
    def model_card(self) -> ModelCard:
        return ModelCard(id="hash-double", root="tests", max_model_len=100_000, created=0)

    @property
    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer()

    @property
    def ready(self) -> bool:
        return True

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        # calls and tools are shown as text, as a template without tool support gets them
        from inference.tool_calls import render_messages

        msgs = render_messages(messages, tools, native=False)
        return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt)  # type: ignore[no-any-return]

    def num_running(self) -> int:
        return 0

    async def abort(self, request_id: str) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def generate(self, prompt_token_ids: list[int], options: SamplingOptions,
                       request_id: str) -> AsyncIterator[TokenDelta]:
        self.requests += 1
        plp: list[TokenLogprob | None] | None = None
        if options.prompt_logprobs is not None:
            plp = [None] + [TokenLogprob(t, chr(t), -0.1 - (_h(tuple(prompt_token_ids[:i]), t) % 1000) / 100)
                            for i, t in enumerate(prompt_token_ids) if i > 0]
        n = options.max_tokens or 16
        seed = options.seed if options.temperature > 0 else 0
        words = [_WORDS[_h(tuple(prompt_token_ids), seed, i) % len(_WORDS)] for i in range(n)]
        for i, w in enumerate(words):
            text = (" " if i else "") + w
            yield TokenDelta(request_id=request_id, index=0, token_ids=[ord(c) for c in text][:1], text=text,
                             finish_reason="length" if i == n - 1 else None,
                             prompt_token_ids=list(prompt_token_ids) if i == 0 else None,
                             prompt_logprobs=plp if i == 0 else None,
                             num_prompt_tokens=len(prompt_token_ids) if i == 0 else None)
