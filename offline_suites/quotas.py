"""Per-tenant quotas on the jobs API: uploaded files (count and bytes) and queued or running work (suite runs
and batches). Without them one tenant could fill the results disk or the shared queue for everyone.

Accounting lives in Redis next to the records it counts:

* ``<prefix>quota:files:<tenant>``: hash, file id -> "bytes:reserved_at";
* ``<prefix>quota:jobs:<tenant>``: sorted set of ``run:<id>`` / ``batch:<id>`` scored by reservation time.

Each limit is the ``suites.tenant_max_*`` setting unless the tenant has its own: ``limits`` (given by the
gateway, which keeps the operator's per-tenant numbers) answers a tenant's overrides, read on every reservation
so that a change applies to the next submission.

A reservation is written first and checked after, so concurrent requests cannot both slip under a limit
(at worst both are refused). Entries are pruned when what they count is gone (a file deleted or expired, a
run or batch finished); an entry whose record does not exist yet is kept for :data:`GRACE_S`, the time its
request has to create it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from offline_suites.config import SuiteSettings
from offline_suites.keys import Keys

GRACE_S = 60.0
# The settings a tenant may have its own value of (``SuiteSettings`` fields).
TENANT_LIMITS: tuple[str, ...] = ("tenant_max_files", "tenant_max_file_bytes", "tenant_max_queued_jobs")
LimitsFor = Callable[[str], Awaitable[Mapping[str, int]]]
_BATCH_DONE = frozenset({"completed", "failed", "expired", "cancelled"})


class QuotaExceeded(Exception):
    """A tenant is at one of its limits; ``limit`` is the setting's name (``suites.<field>``)."""

    def __init__(self, message: str, limit: str, code: str) -> None:
        super().__init__(message)
        self.limit, self.code = limit, code


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class TenantQuotas:
    def __init__(self, redis: Any, settings: SuiteSettings, clock: Any = time.time,
                 limits: LimitsFor | None = None) -> None:
        self.redis, self.settings, self.keys, self.clock = redis, settings, Keys(settings.key_prefix), clock
        self._limits = limits

    async def limits(self, tenant: str) -> dict[str, tuple[int, str]]:
        """Each of :data:`TENANT_LIMITS` for ``tenant``: its value, and how a refusal names it."""
        own = dict(await self._limits(tenant)) if self._limits is not None else {}
        out: dict[str, tuple[int, str]] = {}
        for name in TENANT_LIMITS:
            default = int(getattr(self.settings, name))
            if name in own:
                out[name] = (int(own[name]), f"{name} = {own[name]} for this tenant, set by the operator; "
                                             f"suites.{name} = {default} for the others")
            else:
                out[name] = (default, f"suites.{name} = {default}")
        return out

    # -- files ------------------------------------------------------------------------------------------
    async def _files(self, tenant: str) -> dict[str, int]:
        """The tenant's live files (id -> bytes), dropping entries whose file is gone."""
        key = self.keys.tenant_files(tenant)
        raw = {_s(k): _s(v) for k, v in (await self.redis.hgetall(key)).items()}
        if not raw:
            return {}
        ids = list(raw)
        pipe = self.redis.pipeline(transaction=False)
        for fid in ids:
            pipe.exists(self.keys.file(fid))
        alive = await pipe.execute()
        now, out, dead = self.clock(), {}, []
        for fid, exists in zip(ids, alive, strict=True):
            nbytes, _, at = raw[fid].partition(":")
            if exists or now - float(at or 0) < GRACE_S:
                out[fid] = int(nbytes)
            else:
                dead.append(fid)
        if dead:
            await self.redis.hdel(key, *dead)
        return out

    async def reserve_file(self, tenant: str, file_id: str, nbytes: int) -> None:
        """Count ``file_id`` against ``tenant`` or raise :class:`QuotaExceeded` (nothing counted then)."""
        s, key = self.settings, self.keys.tenant_files(tenant)
        limits = await self.limits(tenant)
        await self.redis.hset(key, file_id, f"{nbytes}:{self.clock()}")
        await self.redis.expire(key, s.keep_runs_s + int(GRACE_S))
        files = await self._files(tenant)
        err: QuotaExceeded | None = None
        (max_files, files_said), (max_bytes, bytes_said) = limits["tenant_max_files"], limits["tenant_max_file_bytes"]
        if len(files) > max_files:
            err = QuotaExceeded(
                f"Tenant '{tenant}' already has {len(files) - 1} files, the most it may keep "
                f"({files_said}). Delete some with DELETE /v1/files/{{file_id}}.",
                "suites.tenant_max_files", "file_count_quota_exceeded")
        elif sum(files.values()) > max_bytes:
            err = QuotaExceeded(
                f"This upload of {nbytes} bytes would bring tenant '{tenant}' to {sum(files.values())} bytes of files, "
                f"over its limit ({bytes_said}). "
                "Delete some with DELETE /v1/files/{file_id}.",
                "suites.tenant_max_file_bytes", "file_bytes_quota_exceeded")
        if err is not None:
            await self.release_file(tenant, file_id)
            raise err

    async def release_file(self, tenant: str, file_id: str) -> None:
        await self.redis.hdel(self.keys.tenant_files(tenant), file_id)

    # -- queued work --------------------------------------------------------------------------------------
    async def _finished(self, member: str) -> bool | None:
        """True when the run or batch ``member`` names is over, None when its record does not exist."""
        from offline_suites.jobs import JobStatus, RunStore

        kind, _, rid = member.partition(":")
        if kind == "run":
            rec = await RunStore(self.redis, self.keys, self.settings.keep_runs_s).get(rid)
            return None if rec is None else JobStatus(rec["status"]).terminal
        raw = await self.redis.get(self.keys.batch(rid))
        if raw is None:
            return None
        import json

        return json.loads(raw).get("status") in _BATCH_DONE

    async def active_jobs(self, tenant: str) -> list[str]:
        key = self.keys.tenant_jobs(tenant)
        now, out, dead = self.clock(), [], []
        for m, at in await self.redis.zrange(key, 0, -1, withscores=True):
            member = _s(m)
            done = await self._finished(member)
            if done or (done is None and now - float(at) >= GRACE_S):
                dead.append(member)
            else:
                out.append(member)
        if dead:
            await self.redis.zrem(key, *dead)
        return out

    async def reserve_job(self, tenant: str, kind: str, rid: str) -> bool:
        """Count run or batch ``rid`` as the tenant's queued work, or raise :class:`QuotaExceeded`. Reserving
        a job already counted (an idempotent resubmission) does not count it twice; returns whether this call
        added it (only then should a failed submission release it)."""
        s, key, member = self.settings, self.keys.tenant_jobs(tenant), f"{kind}:{rid}"
        max_jobs, jobs_said = (await self.limits(tenant))["tenant_max_queued_jobs"]
        already = await self.redis.zscore(key, member) is not None
        if not already:
            await self.redis.zadd(key, {member: self.clock()})
            await self.redis.expire(key, s.keep_runs_s)
        active = await self.active_jobs(tenant)
        if len(active) > max_jobs and not already:
            await self.release_job(tenant, kind, rid)
            raise QuotaExceeded(
                f"Tenant '{tenant}' already has {len(active) - 1} suite runs and batches queued or running, the most "
                f"it may have ({jobs_said}). Wait for one to finish "
                "or cancel one.", "suites.tenant_max_queued_jobs", "job_quota_exceeded")
        return not already

    async def release_job(self, tenant: str, kind: str, rid: str) -> None:
        await self.redis.zrem(self.keys.tenant_jobs(tenant), f"{kind}:{rid}")
