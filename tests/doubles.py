"""Test doubles (never imported by product code): a scripted engine and a scripted guard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from guard.api import FeatureActivation, GuardPolicy, SafetyCut
from guard.text import Conversation, conversation_text
from inference.engine import EngineError, InvalidOptionsError
from inference.types import ModelCard, SamplingOptions, TokenDelta, TokenLogprob


class CharTokenizer:
    """One token per character: ids are code points. Enough for template and usage arithmetic."""

    def __len__(self) -> int:
        return 0x110000

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tokenize: bool = True) -> Any:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        return self.encode(text) if tokenize else text


@dataclass
class ScriptedEngine:
    """Yields a fixed list of text pieces (one token each) per request.

    ``fail_after``: raise EngineError after that many pieces. ``delay``: seconds between pieces.
    """

    pieces: list[str] = field(default_factory=lambda: ["Hello", ",", " world", "!"])
    finish_reason: str = "stop"
    fail_after: int | None = None
    delay: float = 0.0
    max_model_len: int = 512
    card_id: str = "scripted"
    vocab_size: int = 0x110000
    aborted: list[str] = field(default_factory=list)
    requests: list[tuple[list[int], SamplingOptions, str]] = field(default_factory=list)
    templated: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = field(default_factory=list)
    _running: set[str] = field(default_factory=set)

    @property
    def model_card(self) -> ModelCard:
        return ModelCard(id=self.card_id, root="scripted", max_model_len=self.max_model_len, created=0)

    @property
    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer()

    @property
    def ready(self) -> bool:
        return True

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        self.templated.append((list(messages), list(tools) if tools is not None else None))
        msgs = [{**m, "content": m.get("content") or ""} for m in messages]
        if tools:
            msgs.insert(0, {"role": "tools", "content": ",".join(t["function"]["name"] for t in tools)})
        return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt)  # type: ignore[no-any-return]

    def check_options(self, options: SamplingOptions) -> None:
        """Refuses what the scripted tests name as invalid: a schema with ``"invalid": true`` at its top,
        a logit bias on a token id past ``vocab_size``."""
        s = options.structured
        if s is not None and s.json_schema is not None and s.json_schema.get("invalid"):
            raise InvalidOptionsError("scripted: the schema does not compile", param="structured")
        if options.logit_bias and max(options.logit_bias) >= self.vocab_size:
            raise InvalidOptionsError("scripted: token id out of vocabulary", param="logit_bias")

    def num_running(self) -> int:
        return len(self._running)

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self.aborted.append(request_id)
            self._running.discard(request_id)

    async def shutdown(self) -> None:
        return None

    async def generate(self, prompt_token_ids: list[int], options: SamplingOptions, request_id: str) -> AsyncIterator[TokenDelta]:
        self.requests.append((prompt_token_ids, options, request_id))
        self._running.add(request_id)
        pieces = list(self.pieces)
        finish = self.finish_reason
        if options.max_tokens is not None and options.max_tokens < len(pieces):
            pieces, finish = pieces[: options.max_tokens], "length"
        finished = False
        try:
            for i, piece in enumerate(pieces):
                if self.fail_after is not None and i == self.fail_after:
                    raise EngineError("scripted failure")
                if self.delay:
                    await asyncio.sleep(self.delay)
                if request_id not in self._running:
                    return
                last = i == len(pieces) - 1
                lps = None
                if options.logprobs is not None:
                    lps = [TokenLogprob(token_id=i, token=piece, logprob=-0.5, top=tuple((i, piece, -0.5) for _ in range(options.logprobs)))]
                yield TokenDelta(
                    request_id=request_id,
                    index=0,
                    token_ids=[1000 + i],
                    text=piece,
                    finish_reason=finish if last else None,  # type: ignore[arg-type]
                    logprobs=lps,
                    prompt_token_ids=list(prompt_token_ids) if i == 0 else None,
                    num_prompt_tokens=len(prompt_token_ids) if i == 0 else None,
                )
            finished = True
        finally:
            # Like vLLM's AsyncLLM.generate: a generator closed before the end aborts its request.
            if not finished and request_id in self._running:
                self.aborted.append(request_id)
            self._running.discard(request_id)


@dataclass
class ScriptedGuard:
    """Cuts a response when the text released so far plus the next delta contains ``trigger``; flags
    prompts containing ``prompt_trigger``. Holds back nothing beyond the delta being judged."""

    trigger: str = "world"
    prompt_trigger: str = "forbidden"
    name: str = "scripted-guard"
    ready: bool = True
    fail: bool = False

    async def check_prompt(self, conversation: Conversation, policy: GuardPolicy) -> SafetyCut | None:
        if self.prompt_trigger in conversation_text(conversation):
            return SafetyCut(category="test", score=0.9, threshold=0.5, token_offset=0, gate="prompt",
                             features=(FeatureActivation(7, 1.5),))
        return None

    async def watch(self, conversation: Conversation, deltas: AsyncIterator[TokenDelta], policy: GuardPolicy) -> AsyncIterator[TokenDelta | SafetyCut]:
        seen = ""
        offset = 0
        async for d in deltas:
            if self.fail:
                raise RuntimeError("guard crashed")
            if self.trigger in seen + d.text:
                yield SafetyCut(category="test", score=0.8, threshold=0.5, token_offset=offset,
                                features=(FeatureActivation(3, 2.0), FeatureActivation(11, 0.5)), char_offset=len(seen))
                return
            seen += d.text
            offset += len(d.token_ids)
            d.scores = [0.1] * len(d.token_ids)
            yield d

    def threshold(self, gate: str, policy: GuardPolicy) -> float:
        return policy.response_threshold if policy.response_threshold is not None else 0.5

    async def score_text(self, prompt: str | Conversation, response: str | None = None) -> dict[str, Any]:
        text = response if response is not None else (prompt if isinstance(prompt, str) else conversation_text(prompt))
        tokens = list(text)
        scores = [0.9 if text[i:].startswith(self.trigger) else 0.1 for i in range(len(text))]
        cut_at = next((i for i, v in enumerate(scores) if v >= 0.5), None)
        cut = None if cut_at is None else {"token_offset": cut_at, "char_offset": cut_at, "score": 0.9, "category": "test",
                                           "features": [{"id": 3, "activation": 2.0}]}
        return {"tokens": tokens, "scores": scores, "threshold": 0.5, "cut": cut}

    async def moderate(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        return [{"flagged": self.prompt_trigger in t, "categories": {"test": self.prompt_trigger in t},
                 "category_scores": {"test": 0.9 if self.prompt_trigger in t else 0.1}} for t in texts]

    def describe_features(self) -> list[dict[str, Any]]:
        return [{"id": 3, "gate": "response", "category": "test", "weight": 1.0}]
