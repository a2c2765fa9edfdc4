"""Per-tenant guard policy and quotas, resolved from ``OpsSettings.tenants``.

The deployment-wide guard policy (``app.state.guard_policy``) is the base; a tenant's entry overrides
only the fields it sets. Request-level ``guard`` overrides are applied later by the serving code and may
only tighten it, and may switch the guard off only where the operator allows it: the settings
(``allow_guard_disable``, deployment-wide or per tenant) or a grant stored with ``nextguard keys grant``
(:class:`TenantGrants`). Both are off by default.

The jobs API's quotas (uploads, queued runs and batches: ``offline_suites.quotas``) are the ``suites.tenant_max_*``
settings unless the operator set a tenant's own with ``nextguard keys quota`` (:class:`TenantQuotaLimits`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.ops.config import AdmissionSettings, OpsSettings, TenantSettings
from guard.api import GuardPolicy
from offline_suites.quotas import TENANT_LIMITS

log = logging.getLogger(__name__)

GUARD_DISABLE = "guard_disable"
# What an operator can grant a tenant. A grant only ever loosens, so every one is named here on purpose.
GRANTS: tuple[str, ...] = (GUARD_DISABLE,)


@dataclass(frozen=True, slots=True)
class Quota:
    max_in_flight: int
    requests_per_minute: int | None


@dataclass(frozen=True, slots=True)
class TenantView:
    """Everything the request path needs about one tenant, computed once per tenant."""

    name: str
    quota: Quota
    guard_policy: GuardPolicy
    allow_guard_disable: bool


class Tenants:
    def __init__(self, ops: OpsSettings, base_policy: GuardPolicy, base_allow_disable: bool) -> None:
        self.ops = ops
        self.base_policy = base_policy
        self.base_allow_disable = base_allow_disable
        self._views: dict[str, TenantView] = {}

    def settings_for(self, tenant: str) -> TenantSettings:
        return self.ops.tenants.get(tenant) or TenantSettings()

    def quota(self, tenant: str) -> Quota:
        return self.view(tenant).quota

    def view(self, tenant: str) -> TenantView:
        v = self._views.get(tenant)
        if v is None:
            v = self._build(tenant)
            if len(self._views) < 10_000:    # tenants come from keys, so the set is bounded; stay safe anyway
                self._views[tenant] = v
        return v

    def _build(self, tenant: str) -> TenantView:
        # The operator key (tenant "admin") gets the default quota too: it inspects jobs, it does not bypass limits.
        t = self.settings_for(tenant)
        adm: AdmissionSettings = self.ops.admission
        quota = Quota(
            max_in_flight=t.max_in_flight or adm.tenant_max_in_flight,
            requests_per_minute=t.requests_per_minute or adm.tenant_requests_per_minute,
        )
        return TenantView(
            name=tenant,
            quota=quota,
            guard_policy=resolve_policy(self.base_policy, t),
            allow_guard_disable=self.base_allow_disable if t.allow_guard_disable is None else t.allow_guard_disable,
        )


def resolve_policy(base: GuardPolicy, tenant: TenantSettings) -> GuardPolicy:
    """``base`` with the tenant's set fields applied."""
    o = tenant.guard
    changes = {
        f.name: getattr(o, f.name)
        for f in dataclasses.fields(GuardPolicy)
        if getattr(o, f.name, None) is not None
    }
    if "categories" in changes:
        changes["categories"] = tuple(changes["categories"])
    return dataclasses.replace(base, **changes) if changes else base


def check_tenant(tenant: str) -> None:
    if not tenant or not tenant.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"tenant {tenant!r}: use letters, digits, '-' and '_' only")


class TenantGrants:
    """Permissions an operator grants a tenant (``nextguard keys grant``), one Redis set per tenant
    (``<p>:grants:<tenant>``), so every replica sees the same grants.

    The request path reads a grant only when a request asks for what it permits. Answers are cached for
    ``ttl_s`` (the revocation lag). A grant loosens the guard, so when Redis cannot answer it is refused:
    the request stays guarded rather than trusting a stale yes."""

    def __init__(self, redis: Any, prefix: str, ttl_s: float = 5.0, clock: Any = time.monotonic) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[bool, float]] = {}

    def _key(self, tenant: str) -> str:
        return f"{self.prefix}:grants:{tenant}"

    @staticmethod
    def _check(tenant: str, grant: str) -> None:
        check_tenant(tenant)
        if grant not in GRANTS:
            raise ValueError(f"unknown grant {grant!r}; known: {', '.join(GRANTS)}")

    async def grant(self, tenant: str, grant: str) -> None:
        self._check(tenant, grant)
        await self.redis.sadd(self._key(tenant), grant)

    async def revoke(self, tenant: str, grant: str) -> bool:
        """Whether the tenant had the grant."""
        self._check(tenant, grant)
        return bool(await self.redis.srem(self._key(tenant), grant))

    async def list(self, tenant: str | None = None) -> dict[str, list[str]]:
        if tenant is not None:
            keys = [self._key(tenant)]
        else:
            keys = [k.decode() if isinstance(k, bytes) else k async for k in self.redis.scan_iter(match=self._key("*"))]
        out: dict[str, list[str]] = {}
        for k in sorted(keys):
            members = await self.redis.smembers(k)
            if members:
                out[k.rsplit(":", 1)[1]] = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
        return out

    async def has(self, tenant: str, grant: str) -> bool:
        from gateway.ops.auth import REDIS_DOWN

        now = self.clock()
        hit = self._cache.get((tenant, grant))
        if hit is not None and now - hit[1] <= self.ttl_s:
            return hit[0]
        try:
            ok = bool(await self.redis.sismember(self._key(tenant), grant))
        except REDIS_DOWN as e:
            log.warning("grant %s of tenant %s not checked (Redis: %s); refused", grant, tenant, type(e).__name__)
            return False
        if len(self._cache) > 10_000:
            self._cache.clear()     # bounded: tenants come from keys, but stay safe anyway
        self._cache[(tenant, grant)] = (ok, now)
        return ok


class TenantQuotaLimits:
    """A tenant's own jobs-API quotas (the ``suites.tenant_max_*`` settings it does not share), set by the
    operator with ``nextguard keys quota``: one Redis hash per tenant (``<p>:quotas:<tenant>``), so every
    replica sees the same numbers. A quota the tenant has no number for is the setting's. Read on each upload
    or submission (rare next to generation requests), uncached, so a change applies to the next one."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    def _key(self, tenant: str) -> str:
        return f"{self.prefix}:quotas:{tenant}"

    @staticmethod
    def _check(tenant: str, names: Mapping[str, int] | tuple[str, ...]) -> None:
        check_tenant(tenant)
        for name in names:
            if name not in TENANT_LIMITS:
                raise ValueError(f"unknown quota {name!r}; known: {', '.join(TENANT_LIMITS)}")
        if isinstance(names, Mapping):
            for name, value in names.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"quota {name} must be a whole number >= 1 (got {value!r})")

    async def set(self, tenant: str, limits: Mapping[str, int]) -> None:
        self._check(tenant, limits)
        if limits:
            await self.redis.hset(self._key(tenant), mapping={k: str(v) for k, v in limits.items()})

    async def reset(self, tenant: str, names: tuple[str, ...] = TENANT_LIMITS) -> None:
        """Back to the settings' values."""
        self._check(tenant, names)
        if names:
            await self.redis.hdel(self._key(tenant), *names)

    async def get(self, tenant: str) -> dict[str, int]:
        raw = await self.redis.hgetall(self._key(tenant))
        out: dict[str, int] = {}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            if name in TENANT_LIMITS:       # a name an older or newer release wrote is not ours to apply
                out[name] = int(v)
        return out

    async def list(self, tenant: str | None = None) -> dict[str, dict[str, int]]:
        if tenant is not None:
            tenants = [tenant]
        else:
            found = [k.decode() if isinstance(k, bytes) else str(k) async for k in self.redis.scan_iter(match=self._key("*"))]
            tenants = sorted(k.rsplit(":", 1)[1] for k in found)
        out = {}
        for t in tenants:
            got = await self.get(t)
            if got:
                out[t] = got
        return out
