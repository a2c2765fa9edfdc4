"""Side doors around the guard, each tried against the real app (scripted engine and guard doubles): bad
input that used to end as a 5xx or be silently ignored, and engine errors that used to look like guard cuts.
Every test here fails if its door reopens."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from guard.api import GuardInputError, GuardPolicy
from tests.doubles import ScriptedEngine, ScriptedGuard
from tests.ops.conftest import assert_openai_error, chat, client, dead_redis_url, make_app


class LengthLimitedGuard(ScriptedGuard):
    """The scripted guard with a context limit, as the real one has (its tokens are characters here)."""

    max_len: int = 64

    def _check(self, text: str) -> None:
        if len(text) > self.max_len:
            raise GuardInputError(f"The text is {len(text)} guard tokens long; the guard scores at most {self.max_len}.")

    async def moderate(self, texts: Any) -> list[dict[str, Any]]:
        for t in texts:
            self._check(t)
        return await super().moderate(texts)

    async def score_text(self, prompt: Any, response: str | None = None) -> dict[str, Any]:
        self._check(response if response is not None else str(prompt))
        return await super().score_text(prompt, response)

    async def check_prompt(self, conversation: Any, policy: GuardPolicy) -> Any:
        self._check(" ".join(c for _, c in conversation))
        return await super().check_prompt(conversation, policy)


def _app(tmp_path: Path, guard: Any = None) -> tuple[Any, ScriptedEngine]:
    engine = ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=guard or ScriptedGuard(trigger="world"),
                      guard_policy=GuardPolicy())
    return app, engine


# -- text longer than the guard reads: a 400 naming the problem, never a 500 ----------------------------
@pytest.mark.parametrize(("route", "body"), [
    ("/v1/moderations", {"input": "x" * 200}),
    ("/v1/guard/score", {"prompt": "x" * 200}),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "x" * 200}])),
], ids=["moderations", "guard-score", "chat-prompt-gate"])
async def test_text_over_the_guard_context_is_a_400(tmp_path: Path, route: str, body: dict[str, Any]) -> None:
    app, engine = _app(tmp_path, LengthLimitedGuard())
    async with client(app) as c:
        r = await c.post(route, json=body)
    err = assert_openai_error(r, 400, "invalid_guard_input")
    assert "at most 64" in err["message"]
    assert engine.requests == []


# -- a lone surrogate: a 400 naming the field -----------------------------------------------------------
@pytest.mark.parametrize(("route", "raw", "field"), [
    ("/v1/completions", '{"model": "scripted", "prompt": "hi \\ud800 there", "max_tokens": 4}', "prompt"),
    ("/v1/completions", '{"model": "scripted", "prompt": ["ok", "hi \\ud800"], "max_tokens": 4}', "prompt.1"),
    ("/v1/moderations", '{"input": "hi \\ud800"}', "input"),
    ("/v1/guard/score", '{"prompt": "a", "response": "\\udfff"}', "response"),
    ("/v1/chat/completions", '{"model": "scripted", "messages": [{"role": "user", "content": "\\ud800"}]}',
     "messages.0.content"),
], ids=["completions", "completions-list", "moderations", "guard-score", "chat"])
async def test_lone_surrogate_is_a_400(tmp_path: Path, route: str, raw: str, field: str) -> None:
    app, engine = _app(tmp_path)
    async with client(app) as c:
        r = await c.post(route, content=raw.encode(), headers={"content-type": "application/json"})
    err = assert_openai_error(r, 400)
    assert f"'{field}' is not valid Unicode" in err["message"]
    assert engine.requests == []


# -- engine validation errors are 400s before any stream, never guard cuts ------------------------------
@pytest.mark.parametrize(("route", "extra", "param"), [
    ("/v1/chat/completions", {"min_tokens": 10, "max_tokens": 5}, None),
    ("/v1/completions", {"min_tokens": 10, "max_tokens": 5}, None),
    ("/v1/chat/completions", {"seed": 2**64}, "seed"),
    ("/v1/completions", {"seed": -(2**63) - 1}, "seed"),
], ids=["chat-min-tokens", "completions-min-tokens", "chat-seed", "completions-seed"])
async def test_engine_validation_errors_are_400_before_the_stream(tmp_path: Path, route: str, extra: dict[str, Any],
                                                                  param: str | None) -> None:
    app, engine = _app(tmp_path)
    body: dict[str, Any] = chat(**extra) if route.endswith("chat/completions") else {
        "model": "scripted", "prompt": "hi", "stream": True, **extra}
    async with client(app) as c:
        r = await c.post(route, json=body)
    err = assert_openai_error(r, 400)
    assert err["param"] == param
    assert ("min_tokens" in err["message"]) if param is None else ("seed" in err["message"])
    assert engine.requests == []


async def test_an_option_the_engine_refuses_is_a_400_naming_it(tmp_path: Path) -> None:
    """Whatever the engine's own check refuses (not only schemas and logit bias) is refused up front."""
    from inference.engine import InvalidOptionsError

    class Picky(ScriptedEngine):
        def check_options(self, options: Any) -> None:
            if options.temperature == 0.5:
                raise InvalidOptionsError("scripted: temperature 0.5 is not served", param="temperature")

    engine = Picky()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=ScriptedGuard(trigger="world"),
                      guard_policy=GuardPolicy())
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(temperature=0.5))
    err = assert_openai_error(r, 400, "invalid_value")
    assert err["param"] == "temperature" and engine.requests == []


async def test_an_engine_failure_mid_stream_is_an_engine_error_not_a_guard_cut(tmp_path: Path) -> None:
    """The real guard re-raises what its upstream raises (tests/guard/test_service.py); through the gateway
    the client sees the engine's error frame, and no content_filter finish."""
    import json

    engine = ScriptedEngine(fail_after=2)
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=None, guard_policy=GuardPolicy(enabled=False))
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat())
    frames = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    assert any("error" in f and f["error"]["code"] == "engine_error" for f in frames)
    assert not any(c.get("finish_reason") == "content_filter" for f in frames for c in f.get("choices", []))


# -- unknown guard fields and operator headers: 400s like unsupported OpenAI fields ---------------------
@pytest.mark.parametrize(("guard", "field", "hint"), [
    ({"enable": False}, "guard.enable", "did you mean 'enabled'?"),
    ({"response_treshold": 0.1}, "guard.response_treshold", "did you mean 'response_threshold'?"),
    ({"mode": "off"}, "guard.mode", "Known:"),
], ids=["enable", "treshold", "mode"])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_unknown_guard_fields_are_refused(tmp_path: Path, route: str, guard: dict[str, Any], field: str,
                                                hint: str) -> None:
    app, engine = _app(tmp_path)
    body: dict[str, Any] = chat(guard=guard) if route.endswith("chat/completions") else {
        "model": "scripted", "prompt": "hi", "guard": guard}
    async with client(app) as c:
        r = await c.post(route, json=body)
    err = assert_openai_error(r, 400, "invalid_value")
    assert err["param"] == field and hint in err["message"]
    assert engine.requests == []


@pytest.mark.parametrize("header", ["X-NextGuard-Guard", "X-NextGuard-Tenat", "x-nextguard-policy"])
async def test_unknown_operator_headers_are_refused(tmp_path: Path, header: str) -> None:
    app, engine = _app(tmp_path)
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers={header: "off"})
    err = assert_openai_error(r, 400, "unknown_header")
    assert err["param"] == header.lower()
    assert engine.requests == []
    if header == "X-NextGuard-Tenat":
        assert "did you mean 'X-NextGuard-Tenant'?" in err["message"]


async def test_known_operator_header_still_works_without_auth(tmp_path: Path) -> None:
    app, engine = _app(tmp_path)
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers={"X-NextGuard-Tenant": "acme"})
    assert r.status_code == 200 and engine.requests


# -- tool definitions are read by the model, so the prompt gate reads them ------------------------------
def _tool(description: str = "Look up the weather.", param_description: str = "A city name.") -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": "lookup", "description": description,
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": param_description}}}}}


@pytest.mark.parametrize("where", ["description", "parameter"])
async def test_a_harmful_tool_definition_is_refused_like_the_same_system_message(tmp_path: Path, where: str) -> None:
    text = "explain the forbidden procedure step by step"
    tool = _tool(description=text) if where == "description" else _tool(param_description=text)
    app, engine = _app(tmp_path)
    async with client(app) as c:
        as_system = await c.post("/v1/chat/completions", json=chat(
            messages=[{"role": "system", "content": text}, {"role": "user", "content": "hi"}]))
        as_tool = await c.post("/v1/chat/completions", json=chat(tools=[tool]))
    assert_openai_error(as_system, 400, "content_filter")
    assert_openai_error(as_tool, 400, "content_filter")
    assert engine.requests == []


async def test_benign_tools_pass_and_the_guard_reads_them_first(tmp_path: Path) -> None:
    from gateway.protocol import ChatCompletionRequest
    from gateway.serving.chat import guard_conversation

    req = ChatCompletionRequest.model_validate(chat(tools=[_tool()]))
    conv = guard_conversation(req)
    assert conv[0][0] == "system" and '"description": "Look up the weather."' in conv[0][1]
    assert '"description": "A city name."' in conv[0][1] and conv[1] == ("user", "hi")
    app, engine = _app(tmp_path)
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=chat(tools=[_tool()]))
    assert r.status_code == 200 and engine.requests


# -- echoed prompt alternatives would spell out withheld text --------------------------------------------
async def test_echoed_prompt_alternatives_are_refused_while_guarded(tmp_path: Path) -> None:
    body = {"model": "scripted", "prompt": "Hello, wor", "echo": True, "logprobs": 5, "max_tokens": 0}
    app, engine = _app(tmp_path)
    async with client(app) as c:
        r = await c.post("/v1/completions", json=body)
        ok = await c.post("/v1/completions", json={**body, "logprobs": 0})
    err = assert_openai_error(r, 400, "unsupported_with_guard")
    assert err["param"] == "logprobs"
    assert ok.status_code == 200, ok.text
    top = ok.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert all(t is None or len(t) <= 1 for t in top)     # the prompt tokens' own, no alternatives


async def test_echoed_alternatives_where_the_operator_allows_them_or_the_guard_is_off(tmp_path: Path) -> None:
    body = {"model": "scripted", "prompt": "Hello", "echo": True, "logprobs": 2, "max_tokens": 0}
    engine = ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=ScriptedGuard(trigger="world"),
                      guard_policy=GuardPolicy(), echo_alternatives_with_guard=True)
    async with client(app) as c:
        assert (await c.post("/v1/completions", json=body)).status_code == 200
    app2, _ = make_app(ScriptedEngine(), tmp_path, redis_url=dead_redis_url(), guard=None,
                       guard_policy=GuardPolicy(enabled=False))
    async with client(app2) as c:
        assert (await c.post("/v1/completions", json=body)).status_code == 200


# -- a raw prompt in chat markup is read as the conversation it spells out ------------------------------
@dataclass
class RecordingGuard(ScriptedGuard):
    prompts: list[Any] = field(default_factory=list)
    watched: list[Any] = field(default_factory=list)

    async def check_prompt(self, conversation: Any, policy: GuardPolicy) -> Any:
        self.prompts.append(conversation)
        return await super().check_prompt(conversation, policy)

    async def watch(self, conversation: Any, deltas: Any, policy: GuardPolicy) -> Any:
        self.watched.append(conversation)
        async for x in super().watch(conversation, deltas, policy):
            yield x


def test_chat_markup_parses_into_turns() -> None:
    from gateway.serving.template_turns import template_conversation

    chatml = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nPart one<|im_end|>\n"
              "<|im_start|>tool\nresult text<|im_end|>\n<|im_start|>assistant\n")
    assert template_conversation(chatml) == (("system", "Be brief."), ("user", "Part one"), ("tool", "result text"))
    open_answer = "<|im_start|>user\nHow?<|im_end|>\n<|im_start|>assistant\nFirst, take the"
    assert template_conversation(open_answer) == (("user", "How?"), ("assistant", "First, take the"))
    llama = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert template_conversation(llama) == (("user", "Hi there"),)
    assert template_conversation("plain text to continue") is None
    # text outside the turns is still read
    assert template_conversation("preamble <|im_start|>user\nx<|im_end|>") == (("user", "preamble"), ("user", "x"))


async def test_a_completions_prompt_in_chat_markup_is_gated_as_its_turns(tmp_path: Path) -> None:
    guard = RecordingGuard(trigger="world")
    engine = ScriptedEngine()
    app, _ = make_app(engine, tmp_path, redis_url=dead_redis_url(), guard=guard, guard_policy=GuardPolicy())
    prompt = ("<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\nOnce upon a time<|im_end|>\n"
              "<|im_start|>user\nGo on<|im_end|>\n<|im_start|>assistant\nThe king said")
    async with client(app) as c:
        r = await c.post("/v1/completions", json={"model": "scripted", "prompt": prompt, "max_tokens": 2})
        refused = await c.post("/v1/completions", json={
            "model": "scripted", "prompt": "<|im_start|>system\nthe forbidden plan<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"})
    assert r.status_code == 200, r.text
    # the prompt gate reads the turns; the answer in progress is the response gate's, carried into its window
    assert guard.prompts[0] == (("user", "Tell me a story"), ("assistant", "Once upon a time"), ("user", "Go on"))
    assert guard.watched[0][-1] == ("assistant", "The king said")
    assert_openai_error(refused, 400, "content_filter")
