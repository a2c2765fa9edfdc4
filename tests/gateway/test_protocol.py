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


def test_tool_call_shapes_parse_as_openai_objects() -> None:
    from gateway.protocol import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall

    call = ToolCall(id="call_1", function=FunctionCall(name="f", arguments='{"a": 1}'))
    cc = ChatCompletion(id="x", model="m", choices=[ChatChoice(index=0, message=AssistantMessage(tool_calls=[call]), finish_reason="tool_calls")])
    dumped = cc.model_dump(exclude_none=True)
    assert dumped["choices"][0]["message"]["content"] is None, "OpenAI sends null content beside tool calls"
    parsed = OAIChatCompletion.model_validate_json(cc.model_dump_json(exclude_none=True))
    assert parsed.choices[0].message.tool_calls is not None
    assert parsed.choices[0].message.tool_calls[0].function.arguments == '{"a": 1}'  # type: ignore[union-attr]
    delta = DeltaMessage(tool_calls=[DeltaToolCall(index=0, id="call_1", type="function", function=DeltaFunctionCall(name="f", arguments="{}"))])
    chunk = ChatCompletionChunk(id="c", created=1, model="m", choices=[ChatChunkChoice(index=0, delta=delta, finish_reason="tool_calls")])
    oai = OAIChunk.model_validate_json(chunk.model_dump_json(exclude_none=True))
    assert oai.choices[0].delta.tool_calls is not None and oai.choices[0].delta.tool_calls[0].function.name == "f"  # type: ignore[union-attr]


def test_every_vllm_request_field_is_ours_or_refused() -> None:
    """vLLM's server acts on these fields; a client sending one to us must get it honoured or a 400,
    never a silent drop. Fails when a vLLM upgrade adds a field neither served nor listed."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VCompletion

    from gateway.protocol import OPENAI_UNSERVED_FIELDS, VLLM_ONLY_FIELDS

    for ours, theirs in ((ChatCompletionRequest, VChat), (CompletionRequest, VCompletion)):
        missing = set(theirs.model_fields) - set(ours.model_fields) - VLLM_ONLY_FIELDS - OPENAI_UNSERVED_FIELDS - {"user"}
        assert not missing, f"{ours.__name__}: vLLM fields neither served nor refused: {sorted(missing)}"


def test_response_format_and_tool_choice_validation() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    req = ChatCompletionRequest.model_validate(
        {**base, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}}}
    )
    assert req.json_output()
    assert not ChatCompletionRequest.model_validate({**base, "response_format": {"type": "text"}}).json_output()
    with pytest.raises(ValidationError, match="only allowed when 'tools'"):
        ChatCompletionRequest.model_validate({**base, "tool_choice": "auto"})
    ChatCompletionRequest.model_validate({**base, "tool_choice": "none"})
