"""Tool calling pieces without an engine: rendering for templates without tool support, the schema that
constrains required/named calls, and reading calls back out of text as it streams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.engine import InvalidOptionsError
from inference.tool_calls import ToolCallReader, render_messages, template_supports_tools, tool_spec

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find a row",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                          "required": ["key"]}}}]


class _Tok:
    """Renders messages one per line; with ``tools_aware`` the template also lists tool names."""

    def __init__(self, tools_aware: bool) -> None:
        self.tools_aware = tools_aware

    def __len__(self) -> int:
        return 100

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            **_: Any) -> str:
        head = ",".join(t["function"]["name"] for t in tools or []) if self.tools_aware else ""
        return head + "".join(f"{m['role']}:{m['content']}\n" for m in messages)


def test_template_tool_support_is_detected_by_rendering() -> None:
    assert template_supports_tools(_Tok(tools_aware=True))
    assert not template_supports_tools(_Tok(tools_aware=False))


def test_render_for_a_template_without_tools() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "find k1"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "k1"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "v1"},
    ]
    out = render_messages(msgs, TOOLS, native=False)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n")
    assert "<tools>" in out[0]["content"] and '"name": "lookup"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "lookup", "arguments": {"key": "k1"}}\n</tool_call>'}
    assert out[3] == {"role": "tool", "content": "<tool_response>\nv1\n</tool_response>"}
    native = render_messages(msgs, TOOLS, native=True)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {"key": "k1"}, "HF templates take arguments as objects"


def test_named_and_required_schemas_come_from_vllm() -> None:
    named = tool_spec(TOOLS, {"type": "function", "function": {"name": "lookup"}}, None, "hermes")
    assert named is not None and named.mode == "named" and named.schema == TOOLS[0]["function"]["parameters"]
    required = tool_spec(TOOLS, "required", False, "hermes")
    assert required is not None and required.schema is not None
    assert required.schema["type"] == "array" and required.schema["maxItems"] == 1
    auto = tool_spec(TOOLS, "auto", None, "hermes")
    assert auto is not None and auto.schema is None
    assert tool_spec(TOOLS, "none", None, "hermes") is None
    with pytest.raises(InvalidOptionsError, match="Unknown tool-call parser"):
        tool_spec(TOOLS, "auto", None, "no-such-parser")


def _read(mode: Any, pieces: list[str]) -> tuple[list[str], str, list[tuple[str, Any]]]:
    spec = tool_spec(TOOLS, mode, None, "hermes")
    assert spec is not None
    reader = ToolCallReader(spec, _Tok(False))
    released = [reader.feed(p) for p in pieces]
    rest, calls = reader.finish()
    return released, rest, [(c.name, json.loads(c.arguments)) for c in calls]


def test_auto_reader_holds_from_the_first_possible_tag() -> None:
    released, rest, calls = _read("auto", ["ok <", "tool_c", 'all>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'])
    assert released == ["ok ", "", ""]
    assert rest == "" and calls == [("lookup", {"key": "a"})]


def test_auto_reader_gives_back_a_broken_call_as_content() -> None:
    released, rest, calls = _read("auto", ["x <tool_call>", '{"name": "lookup", "argu'])
    assert released == ["x ", ""]
    assert rest == '<tool_call>{"name": "lookup", "argu' and calls == []


def test_auto_reader_refuses_calls_to_functions_not_offered() -> None:
    _, rest, calls = _read("auto", ['<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'])
    assert calls == [] and rest == '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'


def test_required_and_named_readers_hold_everything() -> None:
    released, rest, calls = _read("required", ['[{"name": "lookup", ', '"parameters": {"key": "b"}}]'])
    assert released == ["", ""] and rest == "" and calls == [("lookup", {"key": "b"})]
    released, rest, calls = _read({"type": "function", "function": {"name": "lookup"}}, ['{"key"', ': "c"}'])
    assert rest == "" and calls == [("lookup", {"key": "c"})]
    # output cut short by max_tokens is no call: it goes out as the text it is
    _, rest, calls = _read({"type": "function", "function": {"name": "lookup"}}, ['{"key": "c'])
    assert rest == '{"key": "c' and calls == []


def test_tools_vllm_cannot_combine_are_refused() -> None:
    def tool(name: str, kind: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "$defs": {"X": {"type": kind}}, "properties": {"x": {"$ref": "#/$defs/X"}}}}}

    # one `$defs` name with two schemas cannot become one required-call schema
    with pytest.raises(InvalidOptionsError, match="multiple schemas") as e:
        tool_spec([tool("a", "string"), tool("b", "integer")], "required", None, "hermes")
    assert e.value.param == "tools"
