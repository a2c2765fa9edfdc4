"""Operations settings: API keys, tenants, admission control, audit log.

Nested into the root tree as ``Settings.ops``, so every field has an env var, e.g.
``NEXTGUARD_OPS__AUTH__ENABLED=true`` or
``NEXTGUARD_OPS__TENANTS='{"acme": {"max_in_flight": 8, "guard": {"response_threshold": 0.7}}}'``.
Timeouts (first token, idle, total) and the drain window live in ``ServerSettings``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

DEFAULT_TENANT = "default"
ADMIN_TENANT = "admin"


class AuthSettings(BaseModel):
    """Bearer API keys. Off by default so the embedded one-command start needs no setup;
    the compose deployment turns it on (``NEXTGUARD_OPS__AUTH__ENABLED=true``)."""

    enabled: bool = Field(default=False, description="Require `Authorization: Bearer <key>` on /v1/*.")
    admin_key: SecretStr | None = Field(
        default=None,
        description="A static operator key (tenant `admin`): may read every tenant's jobs. Works with Redis down.",
    )
    cache_ttl_s: float = Field(
        default=5.0, ge=0, description="How long a key lookup is trusted before Redis is asked again (revocation lag)."
    )
    stale_if_error_s: float = Field(
        default=600.0,
        ge=0,
        description="With Redis down, keep accepting keys that were valid this recently (streaming keeps serving).",
    )
    public_paths: tuple[str, ...] = Field(
        default=("/health", "/ready", "/metrics", "/docs", "/docs/", "/openapi.json", "/redoc", "/playground/"),
        description="Paths that never need a key (probes, scrape, schema, the playground page; its API calls "
        "still do). An entry ending in '/' also covers everything below it.",
    )
    metrics_networks: tuple[str, ...] = Field(
        default=(),
        description="When set, /metrics answers only clients in these networks (CIDR, e.g. the internal "
        "network Prometheus scrapes on) and 404 to everyone else. Empty: anyone who reaches the port.",
    )

    @field_validator("metrics_networks")
    @classmethod
    def _cidrs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for net in v:
            ipaddress.ip_network(net, strict=False)     # raises on a typo at start-up, not at scrape time
        return v


class GuardPolicyOverrides(BaseModel):
    """Per-tenant guard policy; unset fields keep the deployment default (``guard.api.GuardPolicy``)."""

    enabled: bool | None = None
    prompt_threshold: float | None = Field(default=None, ge=0)
    response_threshold: float | None = Field(default=None, ge=0)
    hold_back: int | None = Field(default=None, ge=1)
    fail_closed: bool | None = Field(default=None, description="False = fail open (counted and audited).")
    mode: Literal["max", "debounce", "decay"] | None = None
    categories: tuple[str, ...] | None = Field(default=None, description="Only cut on these categories.")


class TenantSettings(BaseModel):
    """Quotas and guard policy of one tenant. A tenant absent from the table gets ``AdmissionSettings``' defaults."""

    max_in_flight: int | None = Field(default=None, ge=1, description="Concurrent requests; over it -> 429.")
    requests_per_minute: int | None = Field(default=None, ge=1, description="Fixed one-minute window; over it -> 429.")
    guard: GuardPolicyOverrides = Field(default_factory=GuardPolicyOverrides)
    allow_guard_disable: bool | None = Field(
        default=None, description="May this tenant's requests switch the guard off (`guard.enabled=false`)?"
    )


class AdmissionSettings(BaseModel):
    """Bounded in-flight requests. A tenant over its own share gets 429 (quota); the deployment as a whole
    being full gets 503 (overload). Both carry ``Retry-After``."""

    enabled: bool = True
    max_in_flight: int = Field(default=128, ge=1, description="Generation requests in flight, all tenants.")
    tenant_max_in_flight: int = Field(default=64, ge=1, description="Default per-tenant bound.")
    tenant_requests_per_minute: int | None = Field(default=None, ge=1, description="Default per-tenant rate.")
    max_queue: int = Field(default=64, ge=0, description="Requests allowed to wait for a global slot.")
    queue_timeout_s: float = Field(default=2.0, ge=0, description="Longest wait for a global slot before 503.")
    retry_after_s: int = Field(default=1, ge=1, description="`Retry-After` for in-flight 429 and 503.")
    lease_ttl_s: float = Field(
        default=30.0,
        gt=1,
        description="A slot in Redis expires unless renewed; a crashed replica's slots free themselves.",
    )
    redis_timeout_s: float = Field(
        default=1.0, gt=0, description="Per Redis call; slower counts as Redis down (includes event-loop lag under load)."
    )
    redis_retry_s: float = Field(default=2.0, gt=0, description="After a Redis failure, use local limits this long.")
    paths: tuple[str, ...] = Field(
        default=("/v1/chat/completions", "/v1/completions", "/v1/moderations", "/v1/guard/score"),
        description="Routes that take an admission slot (the ones that run the engine or the guard).",
    )


class AuditSettings(BaseModel):
    """JSON-lines audit log of guard decisions (one line per guarded choice)."""

    enabled: bool = True
    path: Path | None = Field(default=None, description="Default: <home>/audit/audit.jsonl. `-` = stderr.")
    include_content: bool = Field(default=False, description="Also log prompt and released text (off: ids only).")
    log_passes: bool = Field(default=True, description="Also log guarded choices that were not cut.")
    max_bytes: int = Field(
        default=100 * 1024 * 1024, ge=0, description="Rotate the file when a line would take it past this size (0: never)."
    )
    backups: int = Field(default=10, ge=0, description="Rotated files kept (audit.jsonl.1 ... .N); older ones are deleted.")


class OpsSettings(BaseModel):
    auth: AuthSettings = Field(default_factory=AuthSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    default_tenant: str = Field(default=DEFAULT_TENANT, description="Tenant of every request when auth is off.")

    @field_validator("tenants")
    @classmethod
    def _names(cls, v: dict[str, TenantSettings]) -> dict[str, TenantSettings]:
        for name in v:
            if not name or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"tenant name {name!r}: use letters, digits, '-' and '_' only")
        return v

    @model_validator(mode="after")
    def _checks(self) -> OpsSettings:
        a = self.admission
        if a.tenant_max_in_flight > a.max_in_flight:
            raise ValueError(
                f"admission.tenant_max_in_flight ({a.tenant_max_in_flight}) exceeds admission.max_in_flight "
                f"({a.max_in_flight}); one tenant could never be refused with 429 before the whole gateway is full"
            )
        return self
