"""End-to-end: structured outputs and tool calls from the real embedded SmolLM2 through the guarded gateway,
driven by the official openai SDK. Few, short requests: each costs real CPU decoding."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast for a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


class Trip(pydantic.BaseModel):
    city: Literal["Paris", "London", "Rome"]
    by_train: bool


def test_parse_returns_the_pydantic_object(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.parse(
        model=model_id, response_format=Trip, temperature=0, max_tokens=40,
        messages=[{"role": "user", "content": "Plan a trip to Rome by train. Answer in JSON."}],
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Trip)


def test_named_function_arguments_validate_against_the_tool_schema(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60,  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index, union-attr]


def test_streamed_tool_call_is_assembled_by_the_sdk(client: openai.OpenAI, model_id: str) -> None:
    with client.chat.completions.stream(
        model=model_id, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0,  # type: ignore[list-item]
        max_tokens=80, parallel_tool_calls=False,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    args = call.function.parsed_arguments  # type: ignore[union-attr]
    jsonschema.validate(args, WEATHER["function"]["parameters"])  # type: ignore[index]


def test_guard_cut_inside_tool_arguments_releases_no_call(client: openai.OpenAI, model_id: str) -> None:
    # A response threshold below any score (a tightening, which every tenant may send) makes the real guard
    # cut at the first scored token: inside the arguments, since a named call's whole output is its arguments.
    stream = client.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60, stream=True,  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"guard": {"response_threshold": -1e6}},
    )
    chunks = list(stream)
    assert all(not c.delta.tool_calls for ch in chunks for c in ch.choices), "no part of a call may leave"
    last = chunks[-1].choices[0]
    assert last.finish_reason == "content_filter"
    safety = (last.model_extra or {})["safety"]
    assert safety["gate"] == "response" and safety["token_offset"] == 0


def test_bad_schema_is_a_400_in_the_openai_shape(client: openai.OpenAI, model_id: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id, messages=ASK, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}},
        )
    err = e.value.body
    assert isinstance(err, dict) and err["param"] == "response_format" and err["type"] == "invalid_request_error"
    assert "missing" in err["message"]
