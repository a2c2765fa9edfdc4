"""Turn a serving generator into an HTTP response, with disconnect accounting and metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from gateway import metrics, sse
from gateway.serving.common import StreamStats


def sse_response(items: AsyncIterator[BaseModel], stats: StreamStats, request_id: str) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        status = "200"
        try:
            async for frame in sse.frames(items, request_id):
                yield frame
        except (asyncio.CancelledError, GeneratorExit):
            # Starlette cancels the body when the client goes away; the engine requests are aborted in
            # the choice chains' finally blocks as the cancellation unwinds through them.
            stats.disconnected = True
            status = "499"
            raise
        finally:
            metrics.REQUESTS.labels(stats.route, status).inc()
            metrics.E2E.labels(stats.route).observe(_elapsed(stats))
            metrics.record(stats)

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Request-Id": request_id},
    )


def _elapsed(stats: StreamStats) -> float:
    import time

    return time.perf_counter() - stats.started


def json_response(obj: BaseModel, stats: StreamStats, request_id: str) -> JSONResponse:
    metrics.REQUESTS.labels(stats.route, "200").inc()
    metrics.E2E.labels(stats.route).observe(_elapsed(stats))
    metrics.record(stats)
    return JSONResponse(obj.model_dump(exclude_none=True), headers={"X-Request-Id": request_id})
