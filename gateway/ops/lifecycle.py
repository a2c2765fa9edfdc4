"""The ops layer's runtime and lifecycle: ``install_ops(app, settings)`` (from ``create_app``) builds the
:class:`OpsRuntime` (key store, authenticator, admission, audit log, grants), adds the middleware
(:mod:`gateway.ops.middleware`) and wraps the app's lifespan (lease renewal, SIGTERM drain hook, clean
close). Without a running lifespan (in-process test clients) everything still works: Redis connects lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from gateway import metrics
from gateway.ops.admission import AdmissionController
from gateway.ops.audit import AuditLog
from gateway.ops.auth import Authenticator, KeyStore, OwnerStore
from gateway.ops.config import OpsSettings
from gateway.ops.middleware import OpsMiddleware
from gateway.ops.redis_client import LoopBoundRedis
from gateway.ops.tenants import TenantGrants, TenantQuotaLimits, Tenants

log = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def ops_settings_of(settings: Any) -> OpsSettings:
    """``settings.ops`` once the lead nests it; the defaults until then (auth off, default limits)."""
    ops = getattr(settings, "ops", None)
    return ops if isinstance(ops, OpsSettings) else OpsSettings()


@dataclass
class OpsRuntime:
    """What the ops layer keeps on ``app.state.ops``."""

    app: FastAPI
    settings: Any
    ops: OpsSettings
    redis: Any | None
    keys: KeyStore | None
    owners: OwnerStore | None
    auth: Authenticator | None
    admission: AdmissionController | None
    audit: AuditLog | None
    grants: TenantGrants | None = None
    quota_limits: TenantQuotaLimits | None = None
    _tenants: Tenants | None = None

    @functools.cached_property
    def metrics_networks(self) -> tuple[IPNetwork, ...]:
        return tuple(ipaddress.ip_network(n, strict=False) for n in self.ops.auth.metrics_networks)

    @property
    def tenants(self) -> Tenants:
        # Built on first use: create_app may install the guard policy after install_ops ran.
        if self._tenants is None:
            st = self.app.state
            self._tenants = Tenants(self.ops, st.guard_policy, bool(st.allow_guard_disable))
        return self._tenants

    @property
    def draining(self) -> bool:
        return bool(getattr(self.app.state, "draining", False))

    def begin_drain(self) -> None:
        """Stop taking new work; streams already admitted run to the end (uvicorn waits for them)."""
        if not self.draining:
            log.info("drain: refusing new requests, %d in flight", self.in_flight)
        self.app.state.draining = True
        metrics.DRAINING.set(1)

    @property
    def in_flight(self) -> int:
        return self.admission.in_flight if self.admission is not None else 0

    async def wait_drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight == 0

    async def aclose(self) -> None:
        if self.admission is not None:
            await self.admission.close()
        if self.audit is not None:
            # every line handed to the writer reaches the file before shutdown completes
            await asyncio.to_thread(self.audit.close)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()


def install_ops(app: FastAPI, settings: Any, ops: OpsSettings | None = None) -> OpsRuntime:
    """Wire auth, tenants, admission, timeouts, audit and drain into ``app``. Call once, in ``create_app``
    (``ops`` overrides ``settings.ops``)."""
    if getattr(app.state, "ops", None) is not None:
        raise RuntimeError("install_ops was already called on this app")
    ops = ops or ops_settings_of(settings)
    prefix = settings.redis.key_prefix
    redis = LoopBoundRedis(settings.redis.url, ops.admission.redis_timeout_s)
    keys = KeyStore(redis, prefix)
    rt = OpsRuntime(
        app=app,
        settings=settings,
        ops=ops,
        redis=redis,
        keys=keys,
        owners=OwnerStore(redis, prefix),
        auth=Authenticator(ops.auth, keys) if ops.auth.enabled else None,
        admission=AdmissionController(ops.admission, redis, prefix) if ops.admission.enabled else None,
        audit=AuditLog(ops.audit, settings.home) if ops.audit.enabled else None,
        grants=TenantGrants(redis, prefix, ttl_s=ops.auth.cache_ttl_s),
        quota_limits=TenantQuotaLimits(redis, prefix),
    )
    app.state.ops = rt
    app.add_middleware(OpsMiddleware, runtime=rt)
    _wrap_lifespan(app, rt)
    return rt


def _wrap_lifespan(app: FastAPI, rt: OpsRuntime) -> None:
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        # A (re)started lifespan serves again (test clients run one lifespan per client on the same app).
        app.state.draining = False
        metrics.DRAINING.set(0)
        if rt.admission is not None:
            rt.admission.start()
        restore = _hook_signals(rt)
        try:
            async with inner(a) as state:
                yield state
                # Shutdown begins here. uvicorn has already waited for open connections (its graceful
                # window is drain_timeout_s); this covers servers that do not.
                rt.begin_drain()
                drained = await rt.wait_drained(rt.settings.server.drain_timeout_s)
                if not drained:
                    log.warning("drain: %d request(s) still in flight at shutdown", rt.in_flight)
        finally:
            restore()
            await rt.aclose()

    app.router.lifespan_context = lifespan


def _hook_signals(rt: OpsRuntime) -> Callable[[], None]:
    """Chain SIGTERM/SIGINT: mark draining at once (readiness turns 503, new requests get 503), then let the
    server's own handler (uvicorn's graceful shutdown) run."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        rt.begin_drain()
        prev = previous.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, handler)
        except (ValueError, OSError):     # not allowed here (embedded interpreter): no hook, no harm
            previous.pop(sig, None)

    def restore() -> None:
        for sig, prev in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, prev)

    return restore
