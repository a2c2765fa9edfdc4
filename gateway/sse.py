"""The only module that writes Server-Sent-Event frames.

Every stream the gateway serves ends with ``data: [DONE]``: :func:`frames` guarantees it on the
normal path, on a guard cut, and on an engine error (which becomes one in-stream OpenAI error frame).
A client disconnect cancels the generator; there is nobody left to send ``[DONE]`` to.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from gateway.errors import OpenAIError

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def encode(obj: BaseModel | dict[str, Any]) -> bytes:
    if isinstance(obj, BaseModel):
        payload = obj.model_dump_json(exclude_none=True)
    else:
        payload = json.dumps(obj, separators=(",", ":"))
    return b"data: " + payload.encode() + b"\n\n"


def encode_error(err: OpenAIError) -> bytes:
    return encode(err.body())


async def frames(items: AsyncIterator[BaseModel | dict[str, Any]], request_id: str) -> AsyncIterator[bytes]:
    """Serialise a stream of chunk objects; errors after the first byte become an error frame."""
    try:
        async for item in items:
            yield encode(item)
    except OpenAIError as e:
        yield encode_error(e)
    except Exception:          # the one broad catch: the stream boundary (style §8.12)
        log.exception("stream %s failed", request_id)
        yield encode_error(OpenAIError(500, "The server had an error while generating this response.", code="engine_error"))
    yield DONE
