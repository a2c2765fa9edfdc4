"""``POST /v1/completions`` (legacy text completions), including ``echo`` + ``logprobs`` as
lm-evaluation-harness uses them for log-likelihoods (``max_tokens=0``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import bad_request
from gateway.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    SafetyInfo,
    Usage,
)
from gateway.serving.chat import _finish
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
from gateway.serving.template_turns import template_conversation
from guard.api import GuardFailure, GuardPolicy, SafetyCut
from guard.text import Conversation, split_carry, user
from inference.types import SamplingOptions, TokenDelta, TokenLogprob


@dataclass(slots=True)
class PreparedCompletion:
    id: str
    created: int
    model: str
    prompts: list[tuple[list[int], str]]      # (token ids, text) per prompt
    options: SamplingOptions
    policy: GuardPolicy
    n: int
    echo: bool
    logprobs: int | None
    echo_only: bool                            # max_tokens == 0: score the prompt, generate nothing
    include_usage: bool
    guard_fail_open: list[GuardFailure] = field(default_factory=list)   # prompt gate, failed open
    stats: StreamStats = field(default_factory=lambda: StreamStats(route="completions", model=""))
    started: StartedChoices | None = None   # choices already running (they overlapped the prompt gate)


def guard_conversation_of(prompt: str) -> Conversation:
    """How the guard reads a raw prompt: the conversation its chat markup spells out, else one user turn."""
    return template_conversation(prompt) or user(prompt)


class LogprobBuilder:
    """Accumulates the legacy ``logprobs`` object (tokens, token_logprobs, top_logprobs, text_offset)."""

    def __init__(self, start_offset: int = 0) -> None:
        self.out = CompletionLogprobs()
        self.offset = start_offset

    def add(self, lp: TokenLogprob | None, token_text: str, top: int) -> None:
        self.out.tokens.append(token_text)
        self.out.text_offset.append(self.offset)
        self.offset += len(token_text)
        if lp is None:
            self.out.token_logprobs.append(None)
            self.out.top_logprobs.append(None)
            return
        self.out.token_logprobs.append(lp.logprob)
        tops = {t: v for _, t, v in lp.top[:top]} if top else {}
        tops.setdefault(lp.token, lp.logprob)
        self.out.top_logprobs.append(tops)


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str] | list[list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]  # type: ignore[list-item]
    return prompt  # type: ignore[return-value]


def _tokenise_prompts(tok: Any, raw: list[str] | list[list[int]]) -> list[tuple[list[int], str]]:
    """(token ids, text) per prompt; token-id prompts are checked against the vocabulary."""
    vocab = len(tok)
    prompts: list[tuple[list[int], str]] = []
    for p in raw:
        if isinstance(p, str):
            prompts.append((list(tok.encode(p, add_special_tokens=False)) or [], p))
        else:
            ids = list(p)
            if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in ids):
                raise bad_request(f"'prompt' token ids must be integers in [0, {vocab})", param="prompt")
            prompts.append((ids, tok.decode(ids)))
    return prompts


class ServingCompletion(ServingBase):
    def fan_out(self, req: CompletionRequest) -> int:
        """Choices (engine requests) this request asks for: prompts x n; 400 over the deployment's bounds."""
        return self.limits.check_fan_out(len(_prompt_list(req.prompt)), req.n or 1)

    async def prepare(
        self, req: CompletionRequest, tenant_policy: GuardPolicy | None = None, allow_disable: bool | None = None
    ) -> PreparedCompletion:
        engine = check_model(self.engine, req.model)
        check_fields(req)
        # overrides first: a refused one costs no tokenising
        policy = self.resolve_policy(req.guard, tenant_policy, allow_disable)
        raw = _prompt_list(req.prompt)
        n_chars = sum(len(p) for p in raw)     # characters or token ids: either way, the work to do
        prompts = await self.limits.off_loop(n_chars, _tokenise_prompts, engine.tokenizer, raw)
        for ids, _ in prompts:
            if not ids:
                raise bad_request("'prompt' must not be empty", param="prompt")
            check_prompt_len(len(ids), req.max_tokens or None, engine.model_card.max_model_len)
        guarded = self.guard is not None and policy.enabled
        if guarded and req.echo and req.logprobs and not self.limits.echo_alternatives_with_guard:
            # The alternatives at each prompt position are what the model would have written there; a client
            # extending a prompt one position at a time reads them out, including text the response gate cut.
            raise bad_request(
                "'logprobs' above 0 with 'echo' returns the top alternatives at every prompt position, which this "
                "deployment does not return while the safety guard is on; send 'logprobs': 0 (the prompt tokens' "
                "own log-probabilities) or leave out 'echo'.",
                param="logprobs", code="unsupported_with_guard",
            )
        echo_only = req.max_tokens == 0
        options = SamplingOptions(
            max_tokens=1 if echo_only else req.max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=stop_tuple(req.stop),
            n=1,
            logprobs=req.logprobs,
            prompt_logprobs=req.logprobs if req.echo and req.logprobs is not None else None,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
        )
        check_options(engine, options, "logit_bias")
        p = PreparedCompletion(
            id=new_id("cmpl"),
            created=int(time.time()),
            model=engine.model_card.id,
            prompts=prompts,
            options=options,
            policy=policy,
            n=req.n or 1,
            echo=bool(req.echo),
            logprobs=req.logprobs,
            echo_only=echo_only,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            stats=StreamStats(route="completions", model=engine.model_card.id),
        )
        # the prompt gate reads what the model reads; an answer in progress is the response gate's
        convs = [split_carry(guard_conversation_of(text))[0] for _, text in prompts]
        p.guard_fail_open, p.started = await self.gate(convs, policy, lambda: self._streams(p, p.stats))
        return p

    def _choices(self, p: PreparedCompletion) -> AsyncIterator[tuple[int, TokenDelta | SafetyCut]]:
        """The choices' items: the ones started beside the prompt gate, else started now."""
        return p.started.items() if p.started is not None else merge(self._streams(p, p.stats))

    def _streams(self, p: PreparedCompletion, stats: StreamStats) -> list[AsyncIterator[TokenDelta | SafetyCut]]:
        assert self.engine is not None
        streams = []
        for pi, (ids, text) in enumerate(p.prompts):
            for j in range(p.n):
                k = pi * p.n + j
                streams.append(
                    choice_stream(
                        self.engine, self.guard, p.policy, ids, guard_conversation_of(text), choice_options(p.options, k),
                        f"{p.id}-{k}", stats
                    )
                )
        return streams

    def _echo(self, p: PreparedCompletion, k: int, item: TokenDelta, lp_out: LogprobBuilder | None) -> str:
        """Prompt text (and prompt logprobs) for choice ``k``, sent with its first delta."""
        ids, text = p.prompts[k // p.n]
        if lp_out is not None and item.prompt_logprobs is not None and self.engine is not None:
            tok = self.engine.tokenizer
            for pos, tid in enumerate(ids):
                lp = item.prompt_logprobs[pos] if pos < len(item.prompt_logprobs) else None
                lp_out.add(lp, lp.token if lp is not None else tok.decode([tid]), p.logprobs or 0)
        return text

    def _choice_ready(self, p: PreparedCompletion) -> tuple[list[bool], list[LogprobBuilder | None]]:
        total = len(p.prompts) * p.n
        builders: list[LogprobBuilder | None] = [LogprobBuilder() if p.logprobs is not None else None for _ in range(total)]
        return [False] * total, builders

    async def stream(self, p: PreparedCompletion) -> AsyncIterator[Completion]:
        stats = p.stats
        stats.prompt_tokens = sum(len(ids) for ids, _ in p.prompts) * p.n
        stats.guard_fail_open.extend(p.guard_fail_open)
        echoed, builders = self._choice_ready(p)
        async for k, item in self._choices(p):
            if isinstance(item, SafetyCut):
                stats.cuts.append(item)
                stats.finish_reasons.append("content_filter")
                yield self._chunk(p, CompletionChoice(index=k, text="", finish_reason="content_filter", safety=SafetyInfo(**item.to_dict())))
                continue
            text = ""
            b = builders[k]
            chunk_lp = LogprobBuilder(b.offset) if b is not None else None
            if p.echo and not echoed[k]:
                echoed[k] = True
                text = self._echo(p, k, item, chunk_lp)
            finish = _finish(item)
            if not p.echo_only:
                stats.on_tokens(len(item.token_ids))
                text += item.text
                if chunk_lp is not None and item.logprobs:
                    for lp in item.logprobs:
                        chunk_lp.add(lp, lp.token, p.logprobs or 0)
            if b is not None and chunk_lp is not None:
                b.offset = chunk_lp.offset
            if finish:
                stats.finish_reasons.append("length" if p.echo_only else finish)
            if not text and not finish:
                continue
            yield self._chunk(
                p,
                CompletionChoice(
                    index=k,
                    text=text,
                    logprobs=chunk_lp.out if chunk_lp is not None else None,
                    finish_reason=("length" if p.echo_only else finish) if finish else None,  # type: ignore[arg-type]
                ),
            )
        if p.include_usage:
            yield Completion(
                id=p.id,
                created=p.created,
                model=p.model,
                choices=[],
                usage=Usage(
                    prompt_tokens=stats.prompt_tokens,
                    completion_tokens=stats.completion_tokens,
                    total_tokens=stats.prompt_tokens + stats.completion_tokens,
                ),
            )

    def _chunk(self, p: PreparedCompletion, choice: CompletionChoice) -> Completion:
        return Completion(id=p.id, created=p.created, model=p.model, choices=[choice])

    async def complete(self, p: PreparedCompletion) -> Completion:
        """The non-streamed response is the streamed chunks folded together (one code path to test)."""
        stats = p.stats
        total = len(p.prompts) * p.n
        texts = [""] * total
        finish: list[str | None] = [None] * total
        safety: list[SafetyInfo | None] = [None] * total
        lps: list[CompletionLogprobs | None] = [CompletionLogprobs() if p.logprobs is not None else None for _ in range(total)]
        async for chunk in self.stream(p):
            for c in chunk.choices:
                texts[c.index] += c.text
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
                if c.safety is not None:
                    safety[c.index] = c.safety
                acc = lps[c.index]
                if c.logprobs is not None and acc is not None:
                    acc.tokens.extend(c.logprobs.tokens)
                    acc.token_logprobs.extend(c.logprobs.token_logprobs)
                    acc.top_logprobs.extend(c.logprobs.top_logprobs)
                    acc.text_offset.extend(c.logprobs.text_offset)
        choices = [
            CompletionChoice(
                index=k, text=texts[k], logprobs=lps[k], finish_reason=finish[k] or "stop", safety=safety[k]  # type: ignore[arg-type]
            )
            for k in range(total)
        ]
        usage = Usage(
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.completion_tokens,
            total_tokens=stats.prompt_tokens + stats.completion_tokens,
        )
        return Completion(id=p.id, created=p.created, model=p.model, choices=choices, usage=usage)
