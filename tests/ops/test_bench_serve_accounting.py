"""``nextguard bench serve`` counts delivered tokens from the usage chunk and says which streams ended early
and why (a guard cut, a length stop), so a shortfall in delivered tokens can be traced to its streams."""

from __future__ import annotations

import asyncio
import json

import httpx

from gateway.bench import RunStats, _one, _summ


def _sse(chunks: list[dict]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _run(chunks: list[dict], max_tokens: int) -> RunStats:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=_sse(chunks), headers={"content-type": "text/event-stream"})

    stats = RunStats()

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            await _one(c, "http://x/v1/chat/completions", "m", max_tokens, stats, 3, True, "gateway")

    asyncio.run(go())
    assert seen[0]["stream_options"] == {"include_usage": True}
    return stats


def test_merged_chunks_count_as_the_tokens_they_carry():
    chunks = [{"choices": [{"index": 0, "delta": {"content": "one two"}}]},
              {"choices": [{"index": 0, "delta": {"content": " three four"}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}]
    s = _run(chunks, max_tokens=4)
    assert (s.tokens, s.chunks, s.short) == (4, 2, [])
    assert len(s.tpot) == 1 and _summ(s)["streams_ended_early"] == 0


def test_a_guard_cut_is_reported_with_its_reason():
    safety = {"category": "violence", "score": 2.0, "threshold": 1.0, "token_offset": 2}
    chunks = [{"choices": [{"index": 0, "delta": {"content": "a b"}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter", "safety": safety}]},
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}]
    s = _run(chunks, max_tokens=8)
    assert s.tokens == 2
    assert s.short == [{"request": 3, "server": "gateway", "tokens": 2, "chunks": 1, "finish_reason": "content_filter",
                        "safety": safety}]
