"""Admission control: bounded in-flight requests per tenant and for the whole deployment.

* A tenant over its own bound (``max_in_flight`` or ``requests_per_minute``) gets **429** (quota): the
  deployment has room, this caller is over its share.
* The deployment being full gets **503** (overload) after waiting at most ``queue_timeout_s`` in a
  bounded local queue (``max_queue``); a full queue sheds at once.
* Both answers carry ``Retry-After``.

Limits are shared by every replica through Redis: one sorted set per scope whose members are slot leases
scored by their expiry, so a replica that dies frees its slots after ``lease_ttl_s`` (live replicas renew
theirs). The check-and-take is one Lua script, hence atomic across replicas. When Redis does not answer
within ``redis_timeout_s`` the controller falls back to per-process counters (same numbers, so with N
replicas the bound is N times looser while Redis is away) and tries Redis again after ``redis_retry_s``.
Streaming never stops because Redis did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.errors import OpenAIError
from gateway.ops.auth import REDIS_DOWN
from gateway.ops.config import AdmissionSettings
from gateway.ops.tenants import Quota

log = logging.getLogger(__name__)

WINDOW_S = 60

# KEYS: global zset, tenant zset, tenant rate counter
# ARGV: now, expiry, member, global_max, tenant_max, rpm (0 = none), zset ttl (s)
# Returns {1, 0} admitted | {-1, 0} tenant in-flight | {-2, 0} global | {-3, ttl} tenant rate
_ACQUIRE_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return {-1, 0} end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return {-2, 0} end
local rpm = tonumber(ARGV[6])
if rpm > 0 then
  local used = tonumber(redis.call('GET', KEYS[3]) or '0')
  if used >= rpm then
    local ttl = redis.call('TTL', KEYS[3])
    if ttl < 1 then ttl = 1 end
    return {-3, ttl}
  end
  if redis.call('INCR', KEYS[3]) == 1 then redis.call('EXPIRE', KEYS[3], 60) end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[7])
return {1, 0}
"""


class Rejected(OpenAIError):
    """A refused admission: 429 (tenant quota) or 503 (overload), with ``Retry-After``."""

    def __init__(self, status: int, reason: str, message: str, retry_after: int) -> None:
        super().__init__(
            status,
            message,
            code="rate_limit_exceeded" if status == 429 else "server_overloaded",
            headers={"Retry-After": str(max(1, retry_after))},
        )
        self.reason = reason


@dataclass(slots=True)
class Slot:
    tenant: str
    member: str
    shared: bool            # held in Redis (True) or in the per-process counters (False)
    released: bool = False


@dataclass(slots=True)
class _Local:
    """Per-process counters: the fallback when Redis is away (and the only ones without Redis)."""

    global_n: int = 0
    tenant_n: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)   # tenant -> (window index, count)


class AdmissionController:
    def __init__(self, settings: AdmissionSettings, redis: Any | None, prefix: str) -> None:
        self.s = settings
        self.redis = redis
        self.prefix = prefix
        self.local = _Local()
        self.held: dict[str, Slot] = {}          # member -> slot, for renewal and drain
        self._redis_down_until = 0.0
        self._waiters = 0
        self._freed = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None
        metrics.ADMISSION_SHARED.set(1 if redis is not None else 0)

    # ---------------------------------------------------------------------------------------- keys
    def _gkey(self) -> str:
        return f"{self.prefix}:admit:global"

    def _tkey(self, tenant: str) -> str:
        return f"{self.prefix}:admit:tenant:{tenant}"

    def _rkey(self, tenant: str) -> str:
        return f"{self.prefix}:admit:rate:{tenant}:{int(time.time()) // WINDOW_S}"

    # ---------------------------------------------------------------------------------- public API
    @property
    def in_flight(self) -> int:
        return len(self.held)

    @property
    def shared(self) -> bool:
        return self.redis is not None and time.monotonic() >= self._redis_down_until

    async def acquire(self, tenant: str, quota: Quota) -> Slot:
        """Take a slot or raise :class:`Rejected`. The caller must :meth:`release` it."""
        deadline = time.monotonic() + self.s.queue_timeout_s
        queued = False
        try:
            while True:
                code, retry, slot = await self._try(tenant, quota)
                if slot is not None:
                    metrics.IN_FLIGHT.set(len(self.held))
                    return slot
                if code == -1:
                    raise self._shed(429, "tenant_in_flight", f"Tenant '{tenant}' already has {quota.max_in_flight} "
                                     "requests in flight (its quota); wait for one to finish.", self.s.retry_after_s)
                if code == -3:
                    raise self._shed(429, "tenant_rate", f"Tenant '{tenant}' is over its quota of "
                                     f"{quota.requests_per_minute} requests per minute.", retry)
                # -2: the deployment is full. Wait in the bounded queue, then shed.
                if not queued:
                    if self._waiters >= self.s.max_queue:
                        raise self._shed(503, "queue_full", "The server is at capacity; retry shortly.",
                                         self.s.retry_after_s)
                    queued = True
                    self._waiters += 1
                    metrics.QUEUE_DEPTH.inc()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._shed(503, "queue_timeout", "The server is at capacity; retry shortly.",
                                     self.s.retry_after_s)
                # Local releases wake us at once; releases on other replicas are seen by polling.
                self._freed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, 0.05 if self.shared else left)):
                        await self._freed.wait()
        finally:
            if queued:
                self._waiters -= 1
                metrics.QUEUE_DEPTH.dec()

    async def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self.held.pop(slot.member, None)
        metrics.IN_FLIGHT.set(len(self.held))
        if slot.shared:
            assert self.redis is not None
            try:
                async with asyncio.timeout(self.s.redis_timeout_s):
                    pipe = self.redis.pipeline(transaction=False)
                    pipe.zrem(self._gkey(), slot.member)
                    pipe.zrem(self._tkey(slot.tenant), slot.member)
                    await pipe.execute()
            except REDIS_DOWN as e:
                # The lease expires by itself (lease_ttl_s): nothing is leaked for longer than that.
                self._mark_down(e)
        else:
            self.local.global_n -= 1
            self.local.tenant_n[slot.tenant] -= 1
            if self.local.tenant_n[slot.tenant] <= 0:
                del self.local.tenant_n[slot.tenant]
        self._freed.set()

    def start(self) -> None:
        if self.redis is not None and self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(), name="nextguard-admission-renew")

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(BaseException):
                await self._renewer
            self._renewer = None

    # ---------------------------------------------------------------------------------- internals
    def _shed(self, status: int, reason: str, message: str, retry_after: int) -> Rejected:
        metrics.SHED.labels(str(status), reason).inc()
        return Rejected(status, reason, message, retry_after)

    def _mark_down(self, err: BaseException) -> None:
        if self.shared:
            log.warning("Redis unavailable for admission control (%s); per-process limits for %.1f s",
                        type(err).__name__, self.s.redis_retry_s)
        self._redis_down_until = time.monotonic() + self.s.redis_retry_s
        metrics.ADMISSION_SHARED.set(0)

    async def _try(self, tenant: str, quota: Quota) -> tuple[int, int, Slot | None]:
        member = secrets.token_hex(8)
        if self.shared:
            try:
                code, retry = await self._try_redis(tenant, quota, member)
            except REDIS_DOWN as e:
                self._mark_down(e)
            else:
                metrics.ADMISSION_SHARED.set(1)
                slot = None
                if code == 1:
                    slot = self.held[member] = Slot(tenant, member, shared=True)
                return code, retry, slot
        return self._try_local(tenant, quota, member)

    async def _try_redis(self, tenant: str, quota: Quota, member: str) -> tuple[int, int]:
        assert self.redis is not None
        # Registered per call (cheap: it only hashes the source) so it always targets the current client;
        # redis-py runs it with EVALSHA and loads it on the first NOSCRIPT.
        script = self.redis.register_script(_ACQUIRE_LUA)
        now = time.time()
        async with asyncio.timeout(self.s.redis_timeout_s):
            res = await script(
                keys=[self._gkey(), self._tkey(tenant), self._rkey(tenant)],
                args=[now, now + self.s.lease_ttl_s, member, self.s.max_in_flight, quota.max_in_flight,
                      quota.requests_per_minute or 0, math.ceil(self.s.lease_ttl_s * 4)],
            )
        return int(res[0]), int(res[1])

    def _try_local(self, tenant: str, quota: Quota, member: str) -> tuple[int, int, Slot | None]:
        loc = self.local
        if loc.tenant_n.get(tenant, 0) >= quota.max_in_flight:
            return -1, 0, None
        if loc.global_n >= self.s.max_in_flight:
            return -2, 0, None
        if quota.requests_per_minute:
            now = time.time()
            window = int(now) // WINDOW_S
            w, n = loc.windows.get(tenant, (window, 0))
            if w != window:
                n = 0
            if n >= quota.requests_per_minute:
                return -3, max(1, WINDOW_S - int(now) % WINDOW_S), None
            loc.windows[tenant] = (window, n + 1)
        loc.global_n += 1
        loc.tenant_n[tenant] += 1
        slot = self.held[member] = Slot(tenant, member, shared=False)
        return 1, 0, slot

    async def _renew_loop(self) -> None:
        period = self.s.lease_ttl_s / 3
        while True:
            await asyncio.sleep(period)
            shared = [s for s in list(self.held.values()) if s.shared and not s.released]
            if not shared:
                continue
            expiry = time.time() + self.s.lease_ttl_s
            assert self.redis is not None
            try:
                async with asyncio.timeout(self.s.redis_timeout_s * 4):
                    pipe = self.redis.pipeline(transaction=False)
                    for s in shared:
                        # XX: only refresh leases that still exist (a released one must stay released).
                        pipe.zadd(self._gkey(), {s.member: expiry}, xx=True)
                        pipe.zadd(self._tkey(s.tenant), {s.member: expiry}, xx=True)
                    await pipe.execute()
            except REDIS_DOWN as e:
                self._mark_down(e)
            except Exception:   # never let the renewer die: a dead renewer would expire live slots
                log.exception("admission lease renewal failed")
