"""``LoopBoundRedis``: the ops layer's Redis client (keys, grants, owners, shared admission limits)."""

from __future__ import annotations

import asyncio
from typing import Any


class LoopBoundRedis:
    """A ``redis.asyncio`` client per event loop, behind one object.

    Async Redis connections belong to the loop that opened them. uvicorn runs one loop, but an app may
    also be driven from several (test clients start a loop per request), and a client reused across
    loops fails with an error that is not "Redis is down". Attribute access goes to the current loop's
    client, created on first use; clients of closed loops are dropped.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = max(timeout_s, 0.05)
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}

    def client(self) -> Any:
        import redis.asyncio as aioredis

        loop = asyncio.get_running_loop()
        c = self._clients.get(loop)
        if c is None:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            # Fail fast: a slow Redis must read as a down Redis, not stall requests.
            c = aioredis.Redis.from_url(self.url, socket_timeout=self.timeout_s,
                                        socket_connect_timeout=self.timeout_s, retry_on_timeout=False)
            self._clients[loop] = c
        return c

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client(), name)

    async def aclose(self) -> None:
        c = self._clients.pop(asyncio.get_running_loop(), None)
        if c is not None:
            await c.aclose()
