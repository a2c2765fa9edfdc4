"""The FastAPI application: ``create_app(settings)`` wires settings, engine, guard and routers.

The engine loads in a worker thread after the app starts, so ``/health`` answers at once and
``/ready`` turns 200 when the weights are in. Tests pass a scripted engine instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI

from gateway import metrics
from gateway.api.routes import batches, chat, completions, guard_routes, health, models, playground, suites
from gateway.config import Settings, get_settings
from gateway.errors import install_error_handlers
from gateway.ops.lifecycle import install_ops
from gateway.serving.chat import ServingChat
from gateway.serving.common import ServingLimits
from gateway.serving.completions import ServingCompletion
from guard.api import GuardPolicy, StreamGuard
from inference.engine import EngineClient

log = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], EngineClient]
GuardFactory = Callable[[Settings, EngineClient], StreamGuard]


def _default_engine_factory(settings: Settings) -> EngineClient:
    from inference.vllm_engine import VLLMEngineClient

    return VLLMEngineClient.from_settings(settings.inference)


def _default_guard_factory(settings: Settings, engine: EngineClient) -> StreamGuard:
    from guard.service import NextGuard

    guard = NextGuard(settings.guard).load()
    # Same vocabulary as the generator: the guard reads the engine's token ids directly, no re-tokenising.
    guard.set_generator_tokenizer(engine.tokenizer)
    return cast(StreamGuard, guard)


def _set_engine(app: FastAPI, engine: EngineClient | None, guard: StreamGuard | None = None) -> None:
    st = app.state
    st.engine = engine
    if guard is not None:
        st.guard = guard
    srv = st.settings.server
    limits = ServingLimits(max_prompts=srv.max_prompts_per_request, max_n=srv.max_choices_per_prompt,
                           guard_wait_s=srv.guard_wait_timeout_s, tokenize_inline_chars=srv.tokenize_inline_chars,
                           echo_alternatives_with_guard=srv.echo_alternatives_with_guard,
                           overlap_prompt_gate=srv.overlap_prompt_gate)
    st.serving_chat = ServingChat(engine, st.guard, st.guard_policy, allow_guard_disable=st.allow_guard_disable,
                                  limits=limits)
    st.serving_completion = ServingCompletion(
        engine, st.guard, st.guard_policy, allow_guard_disable=st.allow_guard_disable, limits=limits
    )
    if engine is not None:
        metrics.set_engine_running_source(lambda: float(engine.num_running()))


ENGINE_WATCH_S = 5.0


async def _exit_when_engine_dies(app: FastAPI) -> None:
    while True:
        await asyncio.sleep(ENGINE_WATCH_S)
        engine = app.state.engine
        if engine is not None and not engine.ready and not app.state.draining:
            log.error("the engine died; shutting down (open streams drain) so that the supervisor restarts us")
            # the same path as `docker stop`: the ops layer drains, uvicorn waits for open streams, then exits
            os.kill(os.getpid(), signal.SIGTERM)
            return


def create_app(
    settings: Settings | None = None,
    *,
    engine: EngineClient | None = None,
    engine_factory: EngineFactory | None = None,
    guard: StreamGuard | None = None,
    guard_factory: GuardFactory | None = None,
    guard_policy: GuardPolicy | None = None,
    allow_guard_disable: bool | None = None,
    exit_on_dead_engine: bool = False,
) -> FastAPI:
    """Build the app. Without ``engine`` the vLLM engine loads in the background; without ``guard`` the
    NExT-Guard monitor is built from ``settings.guard`` when enabled (tests inject doubles instead).
    ``exit_on_dead_engine`` (``nextguard serve``): once the engine dies, drain and exit so that the
    supervisor restarts the process; a dead engine never recovers in place."""
    settings = settings or get_settings()
    factory = engine_factory or _default_engine_factory
    build_guard = guard is None and settings.guard.enabled
    gfactory = guard_factory or _default_guard_factory

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader: asyncio.Task[Any] | None = None
        if app.state.engine is None:
            async def load() -> None:
                try:
                    eng = await asyncio.to_thread(factory, settings)
                    g = await asyncio.to_thread(gfactory, settings, eng) if build_guard else None
                except Exception as e:     # keep serving /health and report the cause on /ready
                    log.exception("engine or guard failed to load")
                    app.state.engine_error = type(e).__name__
                    return
                _set_engine(app, eng, g)
                log.info("engine ready: %s (guard: %s)", eng.model_card.id, g.name if g is not None else "off")

            loader = asyncio.create_task(load())
        watchdog = asyncio.create_task(_exit_when_engine_dies(app)) if exit_on_dead_engine else None
        try:
            yield
        finally:
            if watchdog is not None:
                watchdog.cancel()
            app.state.draining = True
            if loader is not None and not loader.done():
                loader.cancel()
                with contextlib.suppress(BaseException):
                    await loader
            if app.state.guard is not None and hasattr(app.state.guard, "aclose"):
                with contextlib.suppress(Exception):
                    await app.state.guard.aclose()
            if app.state.engine is not None and app.state.owns_engine:
                with contextlib.suppress(Exception):
                    await app.state.engine.shutdown()

    app = FastAPI(
        title="nextguard",
        version="0.1.0",
        description="OpenAI-compatible streaming gateway with a token-level safety guard.",
        lifespan=lifespan,
    )
    st = app.state
    st.settings = settings
    st.guard = guard
    st.guard_required = guard is not None or build_guard
    if guard_policy is None:
        guard_policy = settings.guard.default_policy() if build_guard else GuardPolicy(enabled=guard is not None)
    st.guard_policy = guard_policy
    st.allow_guard_disable = settings.allow_guard_disable if allow_guard_disable is None else allow_guard_disable
    st.engine_error = None
    st.draining = False
    st.owns_engine = engine is None
    _set_engine(app, engine)

    install_error_handlers(app)
    # One pure-ASGI middleware (gateway/ops/middleware.py): body cap, auth and tenant, admission, stream timeouts,
    # audit and drain. Pure ASGI rather than BaseHTTPMiddleware so streamed bodies and client
    # disconnects pass through untouched.
    install_ops(app, settings)
    for r in (
        chat.router,
        completions.router,
        models.router,
        guard_routes.router,
        suites.router,
        batches.router,
        playground.router,
        health.router,
    ):
        app.include_router(r)
    return app
