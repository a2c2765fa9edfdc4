"""Per-tenant guard policy and quotas, resolved from ``OpsSettings.tenants``.

The deployment-wide guard policy (``app.state.guard_policy``) is the base; a tenant's entry overrides
only the fields it sets. Request-level ``guard`` overrides are applied later by the serving code and may
only narrow what the tenant allows (``allow_guard_disable``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gateway.ops_config import AdmissionSettings, OpsSettings, TenantSettings
from guard.api import GuardPolicy


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
