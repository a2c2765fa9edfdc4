"""API keys and the tenant they belong to.

* A key is ``ngk_`` + 32 random bytes (url-safe base64). Only its SHA-256 is stored, in Redis, next to the
  tenant and a display id; the plain key is shown once, at creation. A fast hash is the right tool here
  because the keys are high-entropy random strings, not passwords: there is nothing to brute-force.
* The tenant of a request comes from its key and nothing else (never a header or the body).
* Lookups are cached for ``auth.cache_ttl_s`` (the revocation lag) and, while Redis is down, a key that
  was valid within ``auth.stale_if_error_s`` keeps working so streaming survives a Redis outage.
  Keys Redis knows and keys it does not are cached apart: anyone can send any number of made-up keys, and
  they must neither push a real key out (an extra Redis round trip per request, and no stale-if-error
  during an outage) nor grow memory.
* Resources created on behalf of a tenant (suite runs, batches, files) are claimed in an owner set;
  :meth:`OwnerStore.check` refuses every other tenant with the same 404 an unknown id gets, so ids of
  other tenants cannot be probed.

Redis layout (``<p>`` = ``redis.key_prefix``)::

    <p>:apikey:<sha256>        hash {id, tenant, name, created_at, revoked_at}
    <p>:apikeys                hash {id -> sha256}            (list / revoke by id)
    <p>:owner:<kind>:<id>      set of tenant names
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from redis.exceptions import RedisError

from gateway.errors import OpenAIError
from gateway.ops.config import ADMIN_TENANT, AuthSettings

KEY_PREFIX = "ngk_"

# Errors that mean "Redis cannot serve us right now": unreachable, slow, or refusing commands (e.g. OOM,
# read-only replica). Every one of them degrades to the local fallback instead of failing the request.
REDIS_DOWN: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

# Only keys found in Redis enter the known-key cache, so the operator's own key count bounds it; the bound is
# a backstop. Unknown keys get a small LRU of their own: enough to spare Redis a client retrying a bad key.
KNOWN_KEYS_CACHED = 100_000
UNKNOWN_KEYS_CACHED = 4096


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: derived from the API key alone."""

    tenant: str
    key_id: str | None
    admin: bool = False


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    tenant: str
    name: str
    created_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "created_at": int(self.created_at),
            "revoked_at": None if self.revoked_at is None else int(self.revoked_at),
            "status": "active" if self.active else "revoked",
        }


class KeyNotFound(KeyError):
    pass


class KeyStore:
    """Create, list, revoke and look up API keys in Redis (an ``redis.asyncio.Redis`` client)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    def _key(self, digest: str) -> str:
        return f"{self.prefix}:apikey:{digest}"

    @property
    def _index(self) -> str:
        return f"{self.prefix}:apikeys"

    async def create(self, tenant: str, name: str = "") -> tuple[str, KeyRecord]:
        """Return ``(plain_key, record)``. The plain key is not stored anywhere."""
        if not tenant or not tenant.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"tenant {tenant!r}: use letters, digits, '-' and '_' only")
        if tenant == ADMIN_TENANT:
            raise ValueError(f"tenant {ADMIN_TENANT!r} is reserved for the operator key (ops.auth.admin_key)")
        plain = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hash_key(plain)
        rec = KeyRecord(id="key_" + digest[:16], tenant=tenant, name=name, created_at=time.time(), revoked_at=None)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            self._key(digest),
            mapping={"id": rec.id, "tenant": tenant, "name": name, "created_at": repr(rec.created_at), "revoked_at": ""},
        )
        pipe.hset(self._index, rec.id, digest)
        await pipe.execute()
        return plain, rec

    @staticmethod
    def _record(raw: dict[Any, Any]) -> KeyRecord:
        d = {_s(k): _s(v) for k, v in raw.items()}
        return KeyRecord(
            id=d["id"],
            tenant=d["tenant"],
            name=d.get("name", ""),
            created_at=float(d.get("created_at") or 0),
            revoked_at=float(d["revoked_at"]) if d.get("revoked_at") else None,
        )

    async def lookup(self, plain: str) -> KeyRecord | None:
        raw = await self.redis.hgetall(self._key(hash_key(plain)))
        return self._record(raw) if raw else None

    async def list(self, tenant: str | None = None) -> list[KeyRecord]:
        index = await self.redis.hgetall(self._index)
        out = []
        for digest in index.values():
            raw = await self.redis.hgetall(self._key(_s(digest)))
            if raw:
                rec = self._record(raw)
                if tenant is None or rec.tenant == tenant:
                    out.append(rec)
        return sorted(out, key=lambda r: r.created_at)

    async def revoke(self, key_id: str) -> KeyRecord:
        digest = await self.redis.hget(self._index, key_id)
        if digest is None:
            raise KeyNotFound(key_id)
        raw = await self.redis.hgetall(self._key(_s(digest)))
        if not raw:
            raise KeyNotFound(key_id)
        rec = self._record(raw)
        if rec.active:
            # Keep the record (audit trail: who had which key when); a revoked key never authenticates again.
            now = time.time()
            await self.redis.hset(self._key(_s(digest)), "revoked_at", repr(now))
            rec = KeyRecord(rec.id, rec.tenant, rec.name, rec.created_at, now)
        return rec


def unauthorized(message: str, code: str = "invalid_api_key") -> OpenAIError:
    return OpenAIError(401, message, code=code, headers={"WWW-Authenticate": "Bearer"})


class Authenticator:
    """Turns an ``Authorization`` header into a :class:`Principal` (or a 401)."""

    def __init__(self, settings: AuthSettings, store: KeyStore | None, clock: Any = time.monotonic) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        # sha256 -> (record, monotonic time of the Redis answer); least recently used first
        self._known: OrderedDict[str, tuple[KeyRecord, float]] = OrderedDict()
        # sha256 -> monotonic time Redis said it has no such key
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._admin_digest = (
            hash_key(settings.admin_key.get_secret_value()) if settings.admin_key is not None else None
        )

    def invalidate(self) -> None:
        self._known.clear()
        self._unknown.clear()

    @staticmethod
    def bearer(header: str | None) -> str | None:
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    async def authenticate(self, authorization: str | None) -> Principal:
        key = self.bearer(authorization)
        if key is None:
            raise unauthorized(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' "
                "(create one with `nextguard keys create --tenant <name>`).",
                code="missing_api_key",
            )
        digest = hash_key(key)
        if self._admin_digest is not None and hmac.compare_digest(digest, self._admin_digest):
            return Principal(tenant=ADMIN_TENANT, key_id="admin", admin=True)
        rec = await self._lookup(key, digest)
        if rec is None:
            raise unauthorized("Incorrect API key provided.")
        if not rec.active:
            raise unauthorized("This API key has been revoked.", code="revoked_api_key")
        return Principal(tenant=rec.tenant, key_id=rec.id)

    async def _lookup(self, key: str, digest: str) -> KeyRecord | None:
        now = self.clock()
        ttl = self.settings.cache_ttl_s
        hit = self._known.get(digest)
        if hit is not None:
            self._known.move_to_end(digest)
            if now - hit[1] <= ttl:
                return hit[0]
        else:
            missed_at = self._unknown.get(digest)
            if missed_at is not None and now - missed_at <= ttl:
                return None
        if self.store is None:
            raise OpenAIError(503, "API keys are stored in Redis, which is not configured.", code="auth_unavailable")
        try:
            rec = await self.store.lookup(key)
        except REDIS_DOWN as e:
            # Stale-if-error: a key we saw valid recently keeps working through a Redis outage.
            if hit is not None and now - hit[1] <= self.settings.stale_if_error_s:
                return hit[0]
            raise OpenAIError(
                503, "The API key store (Redis) is unreachable; retry shortly.", code="auth_unavailable",
                headers={"Retry-After": "2"},
            ) from e
        if rec is None:
            self._known.pop(digest, None)       # deleted from Redis since we saw it
            self._remember(self._unknown, digest, now, UNKNOWN_KEYS_CACHED)
        else:
            self._unknown.pop(digest, None)
            self._remember(self._known, digest, (rec, now), KNOWN_KEYS_CACHED)
        return rec

    @staticmethod
    def _remember(cache: OrderedDict[str, Any], digest: str, value: Any, bound: int) -> None:
        cache[digest] = value
        cache.move_to_end(digest)
        while len(cache) > bound:
            cache.popitem(last=False)


class OwnerStore:
    """Which tenants may see a resource (run, batch, file). Run ids are scoped to their submitter
    (``offline_suites.jobs.scoped_run_id``), so each record names one tenant in practice; it is a set so that
    claiming again is harmless."""

    def __init__(self, redis: Any, prefix: str, ttl_s: int = 30 * 86400) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = ttl_s

    def _key(self, kind: str, rid: str) -> str:
        return f"{self.prefix}:owner:{kind}:{rid}"

    async def claim(self, kind: str, rid: str, principal: Principal) -> None:
        if self._unrestricted(principal):
            return      # the operator and the single-tenant deployment see everything: nothing to record
        key = self._key(kind, rid)
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(key, principal.tenant)
        pipe.expire(key, self.ttl_s)
        await pipe.execute()

    @staticmethod
    def _unrestricted(principal: Principal) -> bool:
        # The operator key sees everything; without auth (no key at all) the deployment is single-tenant.
        return principal.admin or principal.key_id is None

    async def owns(self, kind: str, rid: str, principal: Principal) -> bool:
        if self._unrestricted(principal):
            return True
        return bool(await self.redis.sismember(self._key(kind, rid), principal.tenant))

    async def check(self, kind: str, rid: str, principal: Principal, not_found: OpenAIError | None = None) -> None:
        """Raise ``not_found`` (pass the route's own unknown-id error, so both read the same) when
        ``principal`` does not own the resource."""
        if not await self.owns(kind, rid, principal):
            raise not_found or OpenAIError(404, f"No {kind} found with id '{rid}'.", param=f"{kind}_id", code="not_found")

    async def visible(self, kind: str, ids: list[str], principal: Principal) -> list[str]:
        """Filter a listing down to what the caller owns (order kept)."""
        if self._unrestricted(principal) or not ids:
            return ids
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.sismember(self._key(kind, rid), principal.tenant)
        flags = await pipe.execute()
        return [rid for rid, ok in zip(ids, flags, strict=True) if ok]

    async def page(
        self,
        kind: str,
        principal: Principal,
        fetch: Callable[[int, str | None], Awaitable[list[dict[str, Any]]]],
        limit: int,
        after: str | None,
        *,
        batch: int = 100,
        max_scanned: int = 10_000,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` items (``{"id": ...}`` dicts, newest first) the caller may see, after ``after``.

        ``fetch(n, after)`` is the store's own pager. Without restriction that is one call; otherwise pages
        are read and filtered until ``limit`` visible items are found or the store is exhausted, so other
        tenants' items neither show up nor leave short pages. ``max_scanned`` bounds the work per call."""
        if self._unrestricted(principal):
            return await fetch(limit, after)
        out: list[dict[str, Any]] = []
        cursor, scanned = after, 0
        while len(out) < limit and scanned < max_scanned:
            items = await fetch(batch, cursor)
            if not items:
                break
            scanned += len(items)
            ok = set(await self.visible(kind, [str(x["id"]) for x in items], principal))
            out.extend(x for x in items if x["id"] in ok)
            if len(items) < batch or items[-1]["id"] == cursor:
                break
            cursor = str(items[-1]["id"])
        return out[:limit]


def _principal(request: Request) -> Principal:
    p = getattr(request.state, "principal", None)
    if p is None:   # ops not installed: single-tenant deployment
        return Principal(tenant="default", key_id=None)
    return p  # type: ignore[no-any-return]


def _owners(request: Request) -> OwnerStore:
    ops = getattr(request.app.state, "ops", None)
    if ops is None or ops.owners is None:
        raise OpenAIError(503, "Ownership records need Redis, which is not configured.", code="redis_unavailable")
    return ops.owners  # type: ignore[no-any-return]


PrincipalDep = Annotated[Principal, Depends(_principal)]
OwnersDep = Annotated[OwnerStore, Depends(_owners)]
