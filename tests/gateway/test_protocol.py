"""Protocol tier: what we emit parses with the official openai SDK's types."""

from __future__ import annotations

import pytest
from openai.types import Completion as OAICompletion
from openai.types.chat import ChatCompletion as OAIChatCompletion
from openai.types.chat import ChatCompletionChunk as OAIChunk
from pydantic import ValidationError

from gateway.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    DeltaMessage,
    SafetyInfo,
    Usage,
)

SAFETY = SafetyInfo(category="violence", score=0.91, threshold=0.4, token_offset=7, features=[{"id": 12, "activation": 3.5}])


def test_chunks_parse_as_openai_chunks() -> None:
    chunks = [
        ChatCompletionChunk(id="c1", created=1, model="m", choices=[ChatChunkChoice(index=0, delta=DeltaMessage(role="assistant", content=""))]),
        ChatCompletionChunk(id="c1", created=1, model="m", choices=[ChatChunkChoice(index=0, delta=DeltaMessage(content="hi"))]),
        ChatCompletionChunk(id="c1", created=1, model="m", choices=[ChatChunkChoice(index=0, delta=DeltaMessage(), finish_reason="content_filter", safety=SAFETY)]),
        ChatCompletionChunk(id="c1", created=1, model="m", choices=[], usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)),
    ]
    for ch in chunks:
        parsed = OAIChunk.model_validate_json(ch.model_dump_json(exclude_none=True))
        assert parsed.id == "c1"
    cut = OAIChunk.model_validate_json(chunks[2].model_dump_json(exclude_none=True))
    assert cut.choices[0].finish_reason == "content_filter"
    # our extension survives in the SDK object's extras
    assert cut.choices[0].model_extra["safety"]["token_offset"] == 7  # type: ignore[index]


def test_completion_objects_parse() -> None:
    cc = ChatCompletion(
        id="x", model="m", choices=[ChatChoice(index=0, message=AssistantMessage(content="ok"), finish_reason="stop")],
        usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    )
    assert OAIChatCompletion.model_validate_json(cc.model_dump_json(exclude_none=True)).choices[0].message.content == "ok"
    comp = Completion(
        id="y", model="m",
        choices=[CompletionChoice(index=0, text="a b", finish_reason="length",
                                  logprobs=CompletionLogprobs(tokens=["a", " b"], token_logprobs=[-0.5, -1.0], top_logprobs=[{"a": -0.5}, {" b": -1.0}], text_offset=[0, 1]))],
    )
    parsed = OAICompletion.model_validate_json(comp.model_dump_json(exclude_none=True))
    assert parsed.choices[0].logprobs is not None and parsed.choices[0].logprobs.token_logprobs == [-0.5, -1.0]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
    ],
    ids=["top-logprobs-without-logprobs", "stream-options-without-stream", "five-stops", "temperature-range", "tools"],
)
def test_invalid_chat_requests(body: dict) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(body)


def test_content_parts_and_extras_accepted() -> None:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "vendor_x": 1}
    )
    assert req.messages[0].text() == "ab"


def test_completion_request_rules() -> None:
    CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 0, "echo": True, "logprobs": 1})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 0})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": []})
