"""The guard's batching engine: every pending guard forward of every stream merged into one runner step,
run in a single worker thread so the event loop (and the generator) keep going while torch computes."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from guard.api import GUARD_CLIENT, GuardBusy


class GuardError(RuntimeError):
    """The guard failed to score (model error, context overflow, ...)."""


@dataclass
class _Job:
    slot: int
    ids: list[int] | None          # None: free the slot once everything queued before has run
    fut: asyncio.Future[Any]
    provisional: int = 0           # the last ids are forgotten by the slot once they are read


def _head(out: Any, n: int) -> Any:
    """A copy of the first ``n`` rows of one slot's output: the residual, or the read-out's tuple of arrays."""
    return tuple(x[:n].copy() for x in out) if isinstance(out, tuple) else out[:n].clone()


def _cat(head: Any, n: int, tail: Any) -> Any:
    """The first ``n`` rows of ``head`` followed by ``tail``."""
    if isinstance(head, tuple):
        import numpy as np

        return tuple(np.concatenate([h[:n], t]) for h, t in zip(head, tail, strict=True))
    import torch

    return torch.cat([head[:n], tail])


class PrefixCache:
    """The keys, values and outputs of recent first forwards of a slot (a conversation's start), so a slot
    whose first forward begins with the same tokens — every request of a deployment usually opens with the
    same system message — copies them instead of computing them again. Used only in the guard's thread."""

    def __init__(self, size: int, min_tokens: int = 16, max_tokens: int = 1024) -> None:
        self.size, self.min_tokens, self.max_tokens = size, min_tokens, max_tokens
        self.entries: collections.OrderedDict[tuple[int, ...], tuple[Any, Any]] = collections.OrderedDict()
        self.hits = 0
        self.tokens_reused = 0

    def lookup(self, ids: Sequence[int]) -> tuple[int, Any, Any] | None:
        """The longest cached start of ``ids`` (at least ``min_tokens``, one token short of all of them, so a
        forward always computes something): (its length, keys and values, output rows)."""
        best: tuple[int, tuple[int, ...]] | None = None
        for key in self.entries:
            n = min(len(key), len(ids) - 1)
            c = next((i for i in range(n) if key[i] != ids[i]), n)
            if c >= self.min_tokens and (best is None or c > best[0]):
                best = (c, key)
        if best is None:
            return None
        c, key = best
        self.entries.move_to_end(key)
        kv, out = self.entries[key]
        self.hits += 1
        self.tokens_reused += c
        return c, kv, out

    def store(self, ids: Sequence[int], kv: Any, out: Any) -> None:
        key = tuple(ids[: self.max_tokens])
        self.entries[key] = (kv, out)
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


class GuardEngine:
    """Owns the runner; merges all pending work into one forward per step (one thread, in order).

    ``readout`` (optional) turns the step's residual rows, all slots' at once, into what the callers need
    (the monitor's latents and norms): in the same thread and one call per step, so the event loop never
    runs torch and the read-out is batched like the forward. :meth:`forward` then returns the read-out's
    rows for its tokens (a tuple of arrays, each sliced the same way) instead of the residual."""

    def __init__(self, runner: Any, max_batch: int, threads: int = 1,
                 readout: Callable[[Any], tuple[Any, ...]] | None = None, prefix_cache: int = 0) -> None:
        self.runner = runner
        self.max_batch = max_batch
        self.readout = readout
        # only runners that can copy a slot's start take part (the HF fallback cannot)
        self.prefix = (PrefixCache(prefix_cache) if prefix_cache > 0 and hasattr(runner, "import_prefix")
                       else None)
        self._threads = threads
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nextguard-guard",
                                        initializer=self._init_thread)
        # clients waiting for a slot, each a FIFO of waiters; dict order is the round-robin order
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._granted = 0          # slots promised to woken waiters that have not allocated yet
        self.steps = 0
        self.batched_rows = 0

    def _init_thread(self) -> None:
        import torch

        torch.set_num_threads(self._threads)

    def _ensure(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            if self._task is not None and self._task.get_loop() is not loop:
                # waiters and grants of another (finished) loop can never be served: start afresh
                self._waiting = {}
                self._granted = 0
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._loop(), name="nextguard-guard-batcher")

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return sum(len(q) for q in self._waiting.values())

    async def acquire(self, timeout: float | None = None, client: str | None = None) -> int:
        """A free slot, or :class:`GuardBusy` after ``timeout`` seconds (None: no bound).

        Waiters queue per client (:data:`guard.api.GUARD_CLIENT` unless ``client`` is given), and a freed
        slot goes to the clients in turn, first come first served within one client: a client with many
        waiters gets one slot per round, like any other. Nothing is capped per client: a slot that is free
        when nobody waits is taken at once."""
        self._ensure()
        if not self._waiting and self.runner.n_active + self._granted < self.runner.max_slots:
            return int(self.runner.alloc())
        who = GUARD_CLIENT.get() if client is None else client
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(who, collections.deque()).append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except BaseException as e:
            granted = fut.done() and not fut.cancelled()
            if not granted:
                self._forget(who, fut)
                if isinstance(e, TimeoutError):
                    raise GuardBusy(f"no guard slot came free within {timeout:g} s") from None
                raise
            if not isinstance(e, TimeoutError):
                # cancelled right after the grant: hand the slot on, or it is lost to everyone
                self._granted -= 1
                self._grant()
                raise
            # the grant and the deadline met: the slot is ours, take it
        self._granted -= 1
        return int(self.runner.alloc())

    def _forget(self, who: str, fut: asyncio.Future[None]) -> None:
        q = self._waiting.get(who)
        if q is None:
            return
        with contextlib.suppress(ValueError):
            q.remove(fut)
        if not q:
            del self._waiting[who]

    def _grant(self) -> None:
        """Hand the free slots to the waiting clients in turn. A grant is a promise of one slot, which the
        waiter allocates itself when it wakes (``_granted`` counts promised slots as taken meanwhile)."""
        while self._waiting and self.runner.n_active + self._granted < self.runner.max_slots:
            who = next(iter(self._waiting))
            q = self._waiting.pop(who)
            fut = q.popleft()
            if q:
                self._waiting[who] = q          # back of the round
            if fut.done():                      # given up between its cancellation and our turn
                continue
            fut.set_result(None)
            self._granted += 1

    async def release(self, slot: int) -> None:
        """Free a slot *through the queue*: a stream cancelled while its forward is queued must not hand
        its slot to a new stream before that forward has run (it would write into the new KV cache)."""
        self._ensure()
        assert self._queue is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Job(slot, None, fut))
        await fut

    async def forward(self, slot: int, ids: Sequence[int], provisional: int = 0) -> Any:
        """Residual rows (len(ids), d_model) after layer L for new tokens of a slot (or, with a ``readout``,
        its arrays' rows for them). The last ``provisional`` ids are read in the same step and then dropped
        from the slot, as if never fed: a stream reads text whose tokens may still change that way."""
        if not 0 <= provisional <= len(ids):
            raise ValueError(f"provisional={provisional} outside 0..{len(ids)}")
        self._ensure()
        assert self._queue is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(slot, list(ids), fut, provisional))
        return await fut

    async def _loop(self) -> None:
        assert self._queue is not None
        q = self._queue
        loop = asyncio.get_running_loop()
        while True:
            first = await q.get()
            await self._gather(q)
            jobs = [first]
            while not q.empty() and len(jobs) < 4 * self.max_batch:
                jobs.append(q.get_nowait())
            frees = [j for j in jobs if j.ids is None]
            jobs = [j for j in jobs if j.ids is not None]
            # one entry per slot (merge successive jobs of a slot), at most max_batch slots per step
            order: list[int] = []
            merged: dict[int, list[_Job]] = {}
            deferred: set[int] = set()
            for j in jobs:
                if j.slot in merged and merged[j.slot][-1].provisional:
                    # ids after dropped ones would sit behind them in the merged step: next step
                    deferred.add(j.slot)
                    q.put_nowait(j)
                    continue
                if j.slot not in merged:
                    if len(order) >= self.max_batch:
                        deferred.add(j.slot)
                        q.put_nowait(j)
                        continue
                    order.append(j.slot)
                    merged[j.slot] = []
                merged[j.slot].append(j)
            for j in [f for f in frees if f.slot in deferred]:
                q.put_nowait(j)         # its slot still has queued work: free it after that
            frees = [f for f in frees if f.slot not in deferred]
            batch = [(s, [t for j in merged[s] for t in (j.ids or [])]) for s in order]
            drop = {s: merged[s][-1].provisional for s in order if merged[s][-1].provisional}
            try:
                outs = await loop.run_in_executor(self._pool, self._step, batch, drop) if batch else []
                self.steps += 1
                self.batched_rows += len(batch)
                for s, out in zip(order, outs, strict=True):
                    k = 0
                    for j in merged[s]:
                        n = len(j.ids or [])
                        if not j.fut.done():
                            j.fut.set_result(out[k:k + n] if self.readout is None
                                             else tuple(a[k:k + n] for a in out))
                        k += n
            except Exception as e:
                # every waiting stream gets the error and applies its policy; the loop itself lives on
                for s in order:
                    for j in merged[s]:
                        if not j.fut.done():
                            j.fut.set_exception(GuardError(f"{type(e).__name__}: {e}"))
            if frees:
                for j in frees:
                    self.runner.free(j.slot)
                    if not j.fut.done():
                        j.fut.set_result(None)
                self._grant()

    @staticmethod
    async def _gather(q: asyncio.Queue[_Job], idle_turns: int = 2, max_turns: int = 32) -> None:
        """Let the event loop run until no more forwards arrive. Streams woken by one step (or one engine
        output) reach the queue some loop turns apart, each through its own read-ahead and re-tokenising; a
        step started on the first alone runs it in a forward of its own, the others in the next, and the
        two halves stay out of phase from then on. A forward's cost is mostly reading the weights, so
        waiting a few turns (microseconds) for the others is far cheaper than a second forward."""
        idle = turns = 0
        while idle < idle_turns and turns < max_turns:
            n = q.qsize()
            await asyncio.sleep(0)
            turns += 1
            idle = idle + 1 if q.qsize() == n else 0

    def _step(self, batch: list[tuple[int, list[int]]], drop: dict[int, int] | None = None) -> list[Any]:
        """The runner's step (then each slot forgets its provisional tokens), then (with a readout) one
        read-out over every row, split back per slot. A slot's first forward starts from the prefix cache
        where a cached conversation start matches, and is cached where none did."""
        drop = drop or {}
        first = {s for s, ids in batch if self.prefix is not None and ids and not drop.get(s)
                 and self.runner.length(s) == 0}
        reused: dict[int, tuple[int, Any]] = {}
        run = []
        for s, ids in batch:
            if s in first and self.prefix is not None and (hit := self.prefix.lookup(ids)) is not None:
                c, kv, out = hit
                self.runner.import_prefix(s, kv, c)
                reused[s] = (c, out)
                ids = ids[c:]
            run.append((s, ids))
        outs = list(self.runner.step(run))
        for s, n in drop.items():
            self.runner.truncate(s, n)
        if self.readout is not None and outs:
            import torch

            arrays = self.readout(torch.cat(outs, dim=0))
            split: list[Any] = []
            k = 0
            for out in outs:
                n = int(out.shape[0])
                split.append(tuple(a[k:k + n] for a in arrays))
                k += n
            outs = split
        for i, (s, ids) in enumerate(batch):
            if s in reused:
                c, head = reused[s]
                outs[i] = _cat(head, c, outs[i])
            elif s in first and self.prefix is not None and len(ids) >= self.prefix.min_tokens:
                # only a start the cache did not know is stored: a hit would store a near-copy of its entry
                # and push other starts out
                m = min(len(ids), self.prefix.max_tokens)
                self.prefix.store(ids, self.runner.export_prefix(s, m), _head(outs[i], m))
        return outs

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)
