"""Guard slots (``guard.batching.GuardEngine.acquire``): bounded waits, shared round-robin between clients
(tenants), first come first served within one, and no per-client cap when nobody waits."""

from __future__ import annotations

import asyncio

import pytest

from guard.api import GUARD_CLIENT, GuardBusy
from guard.batching import GuardEngine
from tests.guard.conftest import FakeRunner


def _engine(slots: int) -> tuple[GuardEngine, FakeRunner]:
    runner = FakeRunner(vocab=8, d=4, max_slots=slots)
    return GuardEngine(runner, slots), runner


async def _until(cond: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():   # type: ignore[operator]
            await asyncio.sleep(0.001)


async def test_a_flooding_client_gets_one_slot_per_round() -> None:
    eng, _ = _engine(1)
    held = await eng.acquire()
    order: list[str] = []

    async def use(name: str, client: str) -> None:
        slot = await eng.acquire(client=client)
        order.append(name)
        await eng.release(slot)

    tasks = [asyncio.create_task(use(f"a{i}", "tenant-a")) for i in range(5)]
    await _until(lambda: eng.waiting == 5)
    tasks.append(asyncio.create_task(use("b0", "tenant-b")))
    await _until(lambda: eng.waiting == 6)
    tasks.append(asyncio.create_task(use("c0", "tenant-c")))
    await _until(lambda: eng.waiting == 7)
    await eng.release(held)
    await asyncio.gather(*tasks)
    # first come first served would be a0..a4, b0, c0: tenant-b and tenant-c wait behind the whole flood
    assert order == ["a0", "b0", "c0", "a1", "a2", "a3", "a4"]
    await eng.close()


async def test_the_client_is_read_from_the_context() -> None:
    eng, _ = _engine(1)
    held = await eng.acquire()
    order: list[str] = []

    async def use(name: str, client: str) -> None:
        GUARD_CLIENT.set(client)          # a task's own copy of the context, as each request has
        slot = await eng.acquire()
        order.append(name)
        await eng.release(slot)

    tasks = [asyncio.create_task(use(f"a{i}", "tenant-a")) for i in range(3)]
    await _until(lambda: eng.waiting == 3)
    tasks.append(asyncio.create_task(use("b0", "tenant-b")))
    await _until(lambda: eng.waiting == 4)
    await eng.release(held)
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "a1", "a2"]
    await eng.close()


async def test_no_per_client_cap_without_contention() -> None:
    """One client (auth off: every request is tenant "default") may hold every slot at once."""
    eng, runner = _engine(16)
    slots = await asyncio.wait_for(asyncio.gather(*(eng.acquire(timeout=0.5) for _ in range(16))), 2)
    assert sorted(slots) == list(range(16)) and runner.n_active == 16
    for s in slots:
        await eng.release(s)
    await eng.close()


async def test_many_waiters_of_one_client_are_all_served() -> None:
    eng, _ = _engine(1)

    async def use() -> None:
        slot = await eng.acquire(timeout=10)
        await asyncio.sleep(0.001)
        await eng.release(slot)

    await asyncio.wait_for(asyncio.gather(*(use() for _ in range(24))), 10)
    assert eng.waiting == 0
    await eng.close()


async def test_a_wait_is_bounded_and_leaves_no_trace() -> None:
    eng, runner = _engine(1)
    held = await eng.acquire()
    with pytest.raises(GuardBusy):
        await eng.acquire(timeout=0.05, client="tenant-b")
    assert eng.waiting == 0
    await eng.release(held)
    # the slot that came free goes to the next comer, not to the waiter that gave up
    assert await eng.acquire(timeout=1) == held and runner.n_active == 1
    await eng.close()


async def test_a_waiter_cancelled_after_its_grant_hands_the_slot_on() -> None:
    eng, runner = _engine(1)
    held = await eng.acquire()
    first = asyncio.create_task(eng.acquire(client="a"))
    second = asyncio.create_task(eng.acquire(client="b"))
    await _until(lambda: eng.waiting == 2)
    await eng.release(held)            # grants the slot to ``first``, which has not run yet
    first.cancel()
    slot = await asyncio.wait_for(second, 2)
    assert first.cancelled() and runner.n_active == 1
    await eng.release(slot)
    assert runner.n_active == 0
    await eng.close()


async def test_forwards_queued_a_few_loop_turns_apart_share_one_step() -> None:
    """Streams woken together reach the guard some event-loop turns apart: they still run in one step,
    not the first alone and the rest in the next."""
    eng, runner = _engine(4)
    slots = [await eng.acquire() for _ in range(4)]

    async def feed(i: int) -> object:
        for _ in range(i):          # stream i arrives i turns after the first
            await asyncio.sleep(0)
        return await eng.forward(slots[i], [i + 1, i + 2])

    outs = await asyncio.gather(*(feed(i) for i in range(4)))
    assert runner.batches == [4]
    assert [len(o) for o in outs] == [2, 2, 2, 2]        # type: ignore[arg-type]
    await eng.close()
