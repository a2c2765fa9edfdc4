from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline_suites.config import SuiteSettings
from offline_suites.keys import Keys

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def suite_llm() -> Iterator[Any]:
    """One LLM client for every suite in the session: the real vLLM engine on the embedded model
    (in-process core, starts in seconds), or the hash double with SUITES_TEST_ENGINE=double."""
    from offline_suites.llm import BackgroundEngine

    if os.environ.get("SUITES_TEST_ENGINE", "real") == "double":
        from tests.offline_suites.doubles import HashEngine

        bg = BackgroundEngine(HashEngine)
    else:
        from inference.config import InferenceSettings
        from inference.vllm_engine import VLLMEngineClient
        from offline_suites.config import suite_engine_settings

        # the engine a suite worker builds: its default dtype is fp32, where a seed fixes a suite's samples
        # whatever shares the engine's steps (the contract test runs every suite twice with one seed)
        inf = suite_engine_settings(InferenceSettings(multiprocessing=False, max_model_len=1024, seed=0), SuiteSettings())
        bg = BackgroundEngine(lambda: VLLMEngineClient.from_settings(inf))
    try:
        client = bg.client()
        # warm the engine's chat and prompt-logprob paths so no suite's time budget pays for it
        client.chat([{"role": "user", "content": "hi"}], max_tokens=2)
        client.continuation_logprobs("The capital of France is", [" Paris"])
        yield client
    finally:
        bg.close()


def _redis_or_skip() -> Any:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    try:
        r.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    return r


@pytest.fixture
def suite_settings(tmp_path: Path) -> Iterator[SuiteSettings]:
    """Settings with a unique key prefix; every key under it (ours and arq's) is removed afterwards."""
    r = _redis_or_skip()
    prefix = f"ngtest:{uuid.uuid4().hex[:12]}:"
    yield SuiteSettings(key_prefix=prefix, results_dir=tmp_path / "results", poll_interval_s=0.05,
                        retry_backoff_s=0.05, max_tries=3, job_timeout_s=60)
    for pat in Keys(prefix).patterns():
        keys = list(r.scan_iter(match=pat, count=1000))
        if keys:
            r.delete(*keys)
    r.close()


@pytest.fixture
async def aredis() -> AsyncIterator[Any]:
    import redis.asyncio as aioredis

    _redis_or_skip()
    client = aioredis.from_url(REDIS_URL)
    yield client
    await client.aclose()
