"""One text format: build, eval, the prompt gate, ``/v1/guard/score`` and the stream read the same guard
tokens for the same conversation (single turn, a system message, several turns, a response whose first
delta starts with whitespace)."""

from __future__ import annotations

import asyncio
import random

import pytest

from guard.api import GuardPolicy
from guard.recipe.encode import guard_input
from guard.recipe.sources import Sample
from guard.text import (
    ResponseFeed,
    conversation_text,
    prompt_text,
    prompt_views,
    response_context,
    response_text,
)
from inference.types import TokenDelta
from tests.guard.conftest import make_guard

CONVERSATIONS = {
    "single turn": (("user", "tell me a story"),),
    "system message": (("system", "you are a friend"), ("user", "how are you today ?")),
    "multi-turn": (("system", "be kind"), ("user", "hello there"), ("assistant", "the sky is blue"),
                   ("user", "tell me a story about pasta")),
}
RESPONSES = ("once upon a time there was a friend", "  \n the weather is nice and the sky is blue")


def test_the_format():
    assert prompt_text((("user", "hi"),)).text == "User: hi"
    conv = CONVERSATIONS["multi-turn"]
    assert conversation_text(conv) == "System: be kind\nUser: hello there\nAssistant: the sky is blue\nUser: tell me a story about pasta"
    gt = response_text(conv, "  ok")
    assert gt.text == conversation_text(conv) + "\nAssistant: ok" and gt.text[gt.char_start:] == "ok"
    p = prompt_text(conv)
    assert p.text[p.char_start:].startswith("be kind")       # the prompt gate reads every turn
    feed = ResponseFeed()
    pieces = [feed(d) for d in (" ", "\n", " once", " upon")]
    assert response_context(conv) + "".join(pieces) == response_text(conv, " \n once upon").text
    with pytest.raises(ValueError, match="Unknown role"):
        conversation_text((("robot", "x"),))


def _deltas(text: str, tok, seed: int) -> list[TokenDelta]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 3)
        prev, now = tok.decode(ids[:i]), tok.decode(ids[:i + n])
        out.append(TokenDelta("r", 0, ids[i:i + n], now[len(prev):]))
        i += n
    out[-1].finish_reason = "stop"
    return out


async def _agen(items):
    for x in items:
        await asyncio.sleep(0)
        yield x


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("response", RESPONSES)
async def test_build_score_endpoint_and_stream_read_the_same_tokens(tok, tmp_path, name, response):
    conv = CONVERSATIONS[name]
    g, runner, _ = make_guard(tok, tmp_path, prompt_threshold=1e9, response_threshold=1e9)
    build_ids, build_span = guard_input(tok, Sample(conv, response, 0, None, "test"))
    assert tok.decode(build_ids[build_span[0]:build_span[1]]).strip() == response.strip()

    # the prompt gate and the build's prompt samples
    n = len(runner.events)
    await g.check_prompt(conv, GuardPolicy())
    # the gate read the whole conversation as the build reads a prompt sample, and each of its views the same
    # way, one text per slot (the views are forwarded concurrently, so which slot got which is not fixed)
    fed = sorted(runner.fed[s] for e, s in runner.events[n:] if e == "alloc")
    texts = [conv, *prompt_views(conv)]
    assert fed == sorted(guard_input(tok, Sample(c, None, 0, None, "test"))[0] for c in texts)
    assert fed == sorted(tok(prompt_text(c).text, add_special_tokens=False)["input_ids"] for c in texts)

    # /v1/guard/score (the service's whole-text scorer)
    r = await g.score_text(conv, response)
    slot = runner.events[-1][1]
    assert runner.fed[slot] == build_ids
    assert len(r["scores"]) == build_span[1] - build_span[0]

    # the stream: context first, then the response re-tokenised delta by delta
    out = [x async for x in g.watch(conv, _agen(_deltas(response, tok, seed=len(name))), GuardPolicy())]
    assert "".join(d.text for d in out) == response
    slot = [s for e, s in runner.events if e == "alloc"][-1]
    assert runner.fed[slot] == build_ids


def test_prompt_views_are_each_message_alone_and_what_the_user_sent_joined():
    from guard.text import prompt_views, user

    assert prompt_views(user("hello")) == []                   # one user message: nothing more to score
    assert prompt_views((("system", "be brief"), ("user", "hi"))) == [user("hi")]
    conv = (("user", "first ask"), ("assistant", "an answer"), ("user", "look this up"), ("tool", "the result"))
    # every user message and tool result alone (an earlier assistant answer is not), then all of them joined
    assert prompt_views(conv) == [user("first ask"), user("look this up"), user("the result"),
                                  user("first ask\nlook this up\nthe result")]
    prefill = (("user", "go on"), ("assistant", "the answer so far"))
    assert prompt_views(prefill) == [user("go on"), user("the answer so far")]
    # the same text twice, or blank messages, are one view and none
    assert prompt_views((("user", "a"), ("user", "a"), ("tool", " "))) == [user("a"), user("a\na")]
    # past the cap, the latest messages are scored alone; the older ones only in the joined view
    many = tuple(("user", f"message {i}") for i in range(12))
    views = prompt_views(many, max_views=3)
    assert views == [user("message 9"), user("message 10"), user("message 11"),
                     user("\n".join(f"message {i}" for i in range(12)))]
