"""Tool calls in a chat stream: the stage that sits between the guard and the chunks, and the mapping of
calls onto the OpenAI wire shapes.

The guard releases a token only once it has scored it, so a call assembled *after* the guard is made of
scored text only. This stage holds back every delta that carries part of a call (a named or required
call is the whole output) and lets it go with the complete call once the choice ends; a cut before that
drops everything held. A client therefore sees a call whole, with every character of its name and
arguments scored, or not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence

from gateway.protocol import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from gateway.serving.common import Item
from guard.api import SafetyCut
from inference.tool_calls import ToolCallReader
from inference.types import TokenDelta
from inference.types import ToolCall as EngineToolCall


async def tool_call_stage(items: AsyncIterator[Item], reader: ToolCallReader) -> AsyncIterator[Item]:
    """Deltas with their call text removed, the complete calls on the last one (``TokenDelta.tool_calls``).

    Deltas that release no text while the reader holds are kept back whole (their tokens, logprobs and
    scores too) and go out merged into the next delta that leaves. A cut is passed on with its
    ``token_offset`` moved back over the tokens held here, which the client never received."""
    held: list[TokenDelta] = []
    last: TokenDelta | None = None
    async for item in items:
        if isinstance(item, SafetyCut):
            withheld = sum(len(d.token_ids) for d in held)
            yield dataclasses.replace(item, token_offset=max(0, item.token_offset - withheld)) if withheld else item
            return
        text = reader.feed(item.text)
        calls: list[EngineToolCall] = []
        if item.finish_reason is not None:
            rest, calls = reader.finish()
            text += rest
        if not text and item.finish_reason is None and reader.holding:
            held.append(item)
            continue
        yield _merged([*held, item], text, calls)
        held, last = [], item
    if reader.holding:
        # the source ended without a finish reason: what is held is read as it stands
        rest, calls = reader.finish()
        if held:
            yield _merged(held, rest, calls)
        elif last is not None:
            yield dataclasses.replace(last, token_ids=[], text=rest, logprobs=None, scores=None, prompt_token_ids=None,
                                      prompt_logprobs=None, num_prompt_tokens=None, tool_calls=calls or None)


def _merged(deltas: Sequence[TokenDelta], text: str, calls: list[EngineToolCall]) -> TokenDelta:
    first, last = deltas[0], deltas[-1]
    logprobs = [lp for d in deltas for lp in d.logprobs or []]
    scores = [s for d in deltas for s in d.scores or []]
    return dataclasses.replace(
        last,
        token_ids=[t for d in deltas for t in d.token_ids],
        text=text,
        logprobs=logprobs if any(d.logprobs is not None for d in deltas) else None,
        scores=scores if any(d.scores is not None for d in deltas) else None,
        prompt_token_ids=first.prompt_token_ids,
        prompt_logprobs=first.prompt_logprobs,
        num_prompt_tokens=first.num_prompt_tokens,
        tool_calls=calls or None,
    )


def wire_calls(calls: Sequence[EngineToolCall]) -> list[ToolCall]:
    return [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


def delta_call(index: int, call: EngineToolCall) -> DeltaToolCall:
    """One complete call as a stream delta: id, name and all its arguments at once (a call never
    leaves in part, see the module docstring); the SDK's stream helpers assemble it like any other."""
    return DeltaToolCall(index=index, id=call.id, type="function",
                         function=DeltaFunctionCall(name=call.name, arguments=call.arguments))
