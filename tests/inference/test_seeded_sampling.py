"""Seeded sampling through the real engine, in fp32: a seed fixes each choice's sample whichever requests share
the engine's steps. (With bf16 CPU kernels, native on AVX512-BF16/AMX machines, the matmuls' rounding depends on
the batch, so a sampled token can change with its neighbours; the gateway's end-to-end test checks a request
repeated alone, and the README says which dtype gives batch-independent seeds.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from inference.types import SamplingOptions

USER = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def fp32_engine() -> Iterator[Any]:
    from inference.config import InferenceSettings
    from inference.vllm_engine import VLLMEngineClient
    from offline_suites.llm import BackgroundEngine

    bg = BackgroundEngine(lambda: VLLMEngineClient.from_settings(
        InferenceSettings(multiprocessing=False, max_model_len=512, seed=0, dtype="float32")))
    try:
        yield bg
    finally:
        bg.close()


async def _choices(engine: Any, ids: list[int], opts: SamplingOptions, rid: str) -> list[str]:
    texts: dict[int, str] = {}
    async for d in engine.generate(ids, opts, rid):
        texts[d.index] = texts.get(d.index, "") + d.text
    return [texts[i] for i in sorted(texts)]


def test_seeded_choices_do_not_depend_on_what_shares_the_engine_steps(fp32_engine: Any) -> None:
    eng = fp32_engine.engine
    ids = eng.apply_chat_template(USER)
    other = eng.apply_chat_template([{"role": "user", "content": "Write a long story about a lighthouse."}])
    seeded = SamplingOptions(max_tokens=12, temperature=1.0, seed=7, n=2)

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, fp32_engine.loop).result(300)

    alone = run(_choices(eng, ids, seeded, "alone"))
    again = run(_choices(eng, ids, seeded, "again"))

    async def beside_others() -> list[str]:
        # a long greedy request already decoding, and two more seeded requests arriving with this one
        long = asyncio.ensure_future(_choices(eng, other, SamplingOptions(max_tokens=64, temperature=0.0), "long"))
        await asyncio.sleep(0.2)
        mine, *_ = await asyncio.gather(
            _choices(eng, ids, seeded, "shared"),
            _choices(eng, other, SamplingOptions(max_tokens=12, temperature=1.0, seed=1), "x"),
            _choices(eng, ids, SamplingOptions(max_tokens=12, temperature=1.0, seed=8, n=3), "y"))
        await long
        return mine

    shared = run(beside_others())
    assert len(alone) == 2 and all(alone)
    assert again == alone
    assert shared == alone
