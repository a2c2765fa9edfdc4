"""Tool calling on the served model, built from vLLM's own pieces.

* The JSON schema that constrains ``tool_choice="required"`` or a named function comes from vLLM
  (``get_json_schema_from_tools``), so even a small model emits a valid call: a named function's output is
  its arguments object; ``required`` outputs a list of ``{"name", "parameters"}`` objects.
* ``auto`` calls are read back out of the generated text by one of vLLM's tool parsers (the model card's
  ``tool_call_parser``, as vLLM's ``--tool-call-parser``).
* A chat template without tool support (the embedded SmolLM2's) is shown the tools in a system prompt in
  the Hermes format, the one the default ``hermes`` parser reads: ``<tools>`` in the system turn, calls as
  ``<tool_call>{"name": …, "arguments": …}</tool_call>``, results as ``<tool_response>`` text.

Plain types in and out (OpenAI tool dicts, :class:`inference.types.ToolCall`); nothing here knows HTTP or
safety policy. vLLM is imported on first use only: a request without tools never pays for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from inference.engine import InvalidOptionsError
from inference.types import ToolCall

log = logging.getLogger(__name__)

ToolMode = Literal["auto", "required", "named"]

HERMES_SYSTEM_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
    "about what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags as follows:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_text(name: str, arguments: str) -> str:
    """A call as the Hermes format writes it (what the model generates and what it is shown of its own
    earlier calls). ``arguments`` is JSON text; it is embedded as JSON where it parses."""
    try:
        args: Any = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        args = arguments
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe", "parameters": {"type": "object"}}}


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` at all (a template without tool support
    silently drops them): the same conversation is rendered with and without a tool and compared."""
    return _supports_tools(tokenizer)


@cache
def _supports_tools(tokenizer: Any) -> bool:
    probe = [{"role": "user", "content": "x"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True)
        without = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    except Exception:                       # a template that chokes on tools does not support them either
        return False
    return bool(with_tools != without)


def render_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                    *, native: bool) -> list[dict[str, Any]]:
    """Messages ready for a chat template, from OpenAI chat messages (``tool_calls`` on assistant turns,
    ``tool`` turns with results).

    ``native``: the template renders tools and calls itself; calls' arguments become objects, as Hugging
    Face templates expect. Otherwise calls become ``<tool_call>`` text in the assistant turn, results
    ``<tool_response>`` text, and the tools a system prompt (joined to the caller's system message)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if native:
            if calls:
                m["tool_calls"] = [_native_call(c) for c in calls]
            out.append(m)
            continue
        m.pop("tool_call_id", None)
        if calls:
            text = m.get("content") or ""
            rendered = "\n".join(call_text(c["function"]["name"], c["function"].get("arguments") or "") for c in calls)
            m["content"] = f"{text}\n{rendered}" if text else rendered
        elif m.get("role") == "tool":
            m["content"] = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    if native or not tools:
        return out
    prompt = HERMES_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


def _native_call(c: dict[str, Any]) -> dict[str, Any]:
    fn = dict(c["function"])
    args = fn.get("arguments")
    if isinstance(args, str):
        # a template that wants text gets text
        with contextlib.suppress(json.JSONDecodeError):
            fn["arguments"] = json.loads(args) if args.strip() else {}
    return {**c, "function": fn}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A request's tools and how they may be used, checked and prepared once for all its choices."""

    tools: tuple[dict[str, Any], ...]
    mode: ToolMode
    name: str | None                        # the named function (mode "named")
    schema: dict[str, Any] | None           # the output constraint (modes "required" and "named")
    parser_name: str
    vllm_request: Any                       # vLLM's ChatCompletionRequest: what its tool parsers read


def tool_spec(tools: Sequence[dict[str, Any]], tool_choice: str | dict[str, Any] | None,
              parallel_tool_calls: bool | None, parser_name: str) -> ToolSpec | None:
    """None for ``tool_choice="none"``. Raises :class:`InvalidOptionsError` (param ``tools`` or
    ``tool_choice``) where vLLM cannot build the constraint or the parser is unknown."""
    if tool_choice == "none" or not tools:
        return None
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMClientError
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    try:
        ToolParserManager.get_tool_parser(parser_name)
    except KeyError:
        raise InvalidOptionsError(
            f"Unknown tool-call parser '{parser_name}'. Available: {', '.join(ToolParserManager.list_registered())}",
            param="tools",
        ) from None
    choice = tool_choice if tool_choice is not None else "auto"
    try:
        req = ChatCompletionRequest(model="", messages=[], tools=list(tools), tool_choice=choice,
                                    parallel_tool_calls=parallel_tool_calls)
        schema = get_json_schema_from_tools(req.tool_choice or "auto", list(req.tools or []), req.parallel_tool_calls)
    except (ValueError, VLLMClientError) as e:   # pydantic's ValidationError is a ValueError
        raise InvalidOptionsError(f"Invalid 'tools' or 'tool_choice': {e}", param="tools") from e
    if isinstance(choice, dict):
        return ToolSpec(tuple(tools), "named", choice["function"]["name"], _as_dict(schema), parser_name, req)
    mode: ToolMode = "required" if choice == "required" else "auto"
    return ToolSpec(tuple(tools), mode, None, _as_dict(schema) if schema is not None else None, parser_name, req)


def _as_dict(schema: str | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(schema, str):
        return dict(json.loads(schema))
    return dict(schema or {})


class ToolCallReader:
    """Reads one choice's tool calls back out of its generated text, as the text arrives.

    :meth:`feed` returns the text that may go out as content now; the rest is held: in ``auto`` mode from
    the first character that could open a call (the parser's start tag, or a prefix of it at the end of
    the text) to the end, in ``required`` and ``named`` mode everything, since the whole output is the
    call. :meth:`finish` parses what was held: the calls, or the held text as content where it holds no
    valid call (or calls a function that was not offered). A call therefore never leaves in part."""

    def __init__(self, spec: ToolSpec, tokenizer: Any) -> None:
        self.spec = spec
        self._text = ""
        self._sent = 0
        self._start_tag: str | None = None
        self._parser: Any = None
        if spec.mode == "auto":
            from vllm.tool_parsers import ToolParserManager

            self._parser = ToolParserManager.get_tool_parser(spec.parser_name)(tokenizer, spec.vllm_request.tools)
            tag = getattr(self._parser, "tool_call_start_token", None)
            # a parser without a start tag (bare JSON, pythonic calls) can only be read at the end
            self._start_tag = tag if isinstance(tag, str) and tag else None

    @property
    def holding(self) -> bool:
        return self._sent < len(self._text)

    def feed(self, text: str) -> str:
        self._text += text
        if self.spec.mode != "auto" or self._start_tag is None:
            return ""
        at = self._text.find(self._start_tag, self._sent)
        if at < 0:
            at = len(self._text) - _tag_prefix_overlap(self._text, self._start_tag)
        out, self._sent = self._text[self._sent:at], max(self._sent, at)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet returned, calls). Call once, after the last :meth:`feed`."""
        held = self._text[self._sent:]
        self._sent = len(self._text)
        if self.spec.mode == "named":
            assert self.spec.name is not None
            return ("", [ToolCall(new_call_id(), self.spec.name, held.strip())]) if _is_json(held) else (held, [])
        if self.spec.mode == "required":
            calls = _required_calls(held)
            return ("", calls) if calls else (held, [])
        info = self._parser.extract_tool_calls(self._text, self.spec.vllm_request)
        if not info.tools_called or not info.tool_calls:
            return held, []
        offered = {t["function"]["name"] for t in self.spec.tools}
        if any(c.function.name not in offered for c in info.tool_calls):
            # a call to a function the caller never offered is text, not a call a client could run
            return held, []
        calls = [ToolCall(new_call_id(), c.function.name, c.function.arguments) for c in info.tool_calls]
        return "", calls


def _tag_prefix_overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return bool(text.strip())


def _required_calls(text: str) -> list[ToolCall]:
    """``required`` output: a JSON list of ``{"name", "parameters"}`` (vLLM's schema for it)."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(items, list):
        return []
    calls = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            return []
        calls.append(ToolCall(new_call_id(), it["name"], json.dumps(it.get("parameters", {}), ensure_ascii=False)))
    return calls


__all__ = [
    "ToolCallReader",
    "ToolSpec",
    "call_text",
    "new_call_id",
    "render_messages",
    "template_supports_tools",
    "tool_spec",
]
