"""``nextguard worker``: an arq worker that executes suite runs and inference batches.

Scale-out is arq's: start N worker processes on M machines with the same Redis URL and key prefix;
each pulls from the one queue. A worker co-located with the engine (``suites.llm_backend=engine``)
builds the in-process vLLM engine on first use by an LLM-facing suite; a remote worker uses the
gateway's public API (``llm_backend=api``) and so sees the guarded path clients see.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from offline_suites.config import SuiteSettings
from offline_suites.jobs import RUN_FUNCTION, job_deserializer, job_serializer, run_suite_job
from offline_suites.keys import Keys

log = logging.getLogger(__name__)
BATCH_FUNCTION = "run_batch"


def engine_llm_factory(loop: asyncio.AbstractEventLoop, inference_settings: Any) -> tuple[Callable[[], Any], Callable[[], None]]:
    """Lazy in-process engine: built (blocking) in the first suite thread that asks for the LLM,
    then shared by every later run of this worker. Returns (factory, closer)."""
    from offline_suites.llm import EngineLLMClient

    lock = threading.Lock()
    holder: dict[str, Any] = {}

    def factory() -> Any:
        with lock:
            if "engine" not in holder:
                from inference.vllm_engine import VLLMEngineClient

                holder["engine"] = VLLMEngineClient.from_settings(inference_settings)
        return EngineLLMClient(holder["engine"], loop)

    def close() -> None:
        eng = holder.get("engine")
        if eng is not None:     # called from a thread while the loop is awaiting us
            asyncio.run_coroutine_threadsafe(eng.shutdown(), loop).result(60)

    return factory, close


def build_worker(settings: SuiteSettings, redis_url: str, *, inference_settings: Any = None,
                 llm_factory: Callable[[], Any] | None = None, burst: bool = False, poll_delay: float = 0.5,
                 handle_signals: bool = True, max_jobs: int | None = None) -> Any:
    """An ``arq.Worker`` for this platform (the tests build one with ``burst=True``)."""
    from arq import Worker, func
    from arq.connections import RedisSettings

    from offline_suites.batch import run_batch_job

    keys = Keys(settings.key_prefix)

    async def on_startup(ctx: dict[str, Any]) -> None:
        ctx["suite_settings"] = settings
        if llm_factory is not None:
            ctx["llm_factory"] = llm_factory
        elif settings.llm_backend == "api":
            from offline_suites.llm import build_openai_client

            ctx["llm_factory"] = lambda: build_openai_client(settings)
        elif inference_settings is not None:
            factory, closer = engine_llm_factory(asyncio.get_running_loop(), inference_settings)
            ctx["llm_factory"], ctx["llm_close"] = factory, closer
        settings.results_dir.mkdir(parents=True, exist_ok=True)

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        closer = ctx.get("llm_close")
        if closer is not None:
            await asyncio.to_thread(closer)

    return Worker(
        functions=[func(run_suite_job, name=RUN_FUNCTION, max_tries=settings.max_tries + 1,
                        timeout=settings.job_timeout_s),
                   func(run_batch_job, name=BATCH_FUNCTION, max_tries=settings.max_tries + 1,
                        timeout=settings.job_timeout_s)],
        redis_settings=RedisSettings.from_dsn(redis_url),
        queue_name=keys.queue,
        health_check_key=keys.health_check,
        max_jobs=max_jobs or settings.max_jobs,
        job_timeout=settings.job_timeout_s,
        keep_result=0,              # records live in our own keys; arq's result copies are not needed
        on_startup=on_startup,
        on_shutdown=on_shutdown,
        burst=burst,
        poll_delay=poll_delay,
        handle_signals=handle_signals,
        allow_abort_jobs=False,
        job_serializer=job_serializer,          # JSON, never pickle (see offline_suites.jobs)
        job_deserializer=job_deserializer,
    )


def main_worker(settings: SuiteSettings, redis_url: str, inference_settings: Any = None, burst: bool = False) -> int:
    worker = build_worker(settings, redis_url, inference_settings=inference_settings, burst=burst)
    worker.run()
    return 0
