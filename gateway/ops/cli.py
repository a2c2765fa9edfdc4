"""``nextguard keys create|list|revoke|grant|ungrant|grants|quota|quotas`` and ``nextguard bench load``.

``gateway.cli`` calls :func:`add_subcommands` and :func:`add_bench_subcommands` (listed in its
``SUBCOMMAND_MODULES``). Key commands talk to Redis directly: they are for the operator on the box, the
same Redis every gateway replica reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.config import RedisSettings


class _RedisOnly(BaseSettings):
    """Only the ``redis`` branch of the settings tree: key management must not need a model or a guard."""

    model_config = SettingsConfigDict(
        env_prefix="NEXTGUARD_", env_nested_delimiter="__", env_ignore_empty=True, extra="ignore"
    )
    redis: RedisSettings = Field(default_factory=RedisSettings)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _store(args: argparse.Namespace) -> tuple[Any, Any]:
    import redis.asyncio as aioredis

    from gateway.ops.auth import KeyStore

    rs = _RedisOnly().redis
    client = aioredis.Redis.from_url(args.redis_url or rs.url, socket_connect_timeout=3, socket_timeout=3)
    return client, KeyStore(client, args.prefix or rs.key_prefix)


def _quota_value(text: str) -> int | str:
    """A quota on the command line: a whole number >= 1, or ``default`` (back to the ``suites.*`` setting)."""
    if text == "default":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (or 'default')") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1; to fall back to the setting, pass 'default'")
    return value


def _keys(args: argparse.Namespace) -> int:
    from gateway.ops.auth import KeyNotFound
    from gateway.ops.tenants import TenantGrants, TenantQuotaLimits
    from offline_suites.quotas import TENANT_LIMITS

    async def run() -> int:
        client, store = _store(args)
        grants = TenantGrants(client, store.prefix)
        own = TenantQuotaLimits(client, store.prefix)
        try:
            if args.keys_command == "quota":
                asked = {n: getattr(args, n) for n in TENANT_LIMITS if getattr(args, n) is not None}
                try:
                    await own.reset(args.tenant, tuple(n for n, v in asked.items() if v == "default"))
                    await own.set(args.tenant, {n: int(v) for n, v in asked.items() if v != "default"})
                except ValueError as e:
                    sys.stderr.write(f"{e}\n")
                    return 2
                limits = await own.get(args.tenant)
                said = ", ".join(f"{n}={v}" for n, v in limits.items()) or "no quotas of its own"
                _out(json.dumps({"tenant": args.tenant, "quotas": limits}) if args.json
                     else f"tenant {args.tenant}: {said} (the rest: the suites.tenant_max_* settings; applies from "
                          "its next upload or submission)")
            elif args.keys_command == "quotas":
                tenants = await own.list(args.tenant)
                if args.json:
                    _out(json.dumps(tenants))
                else:
                    for tenant, own_limits in tenants.items():
                        _out(f"{tenant}\t" + ",".join(f"{n}={v}" for n, v in own_limits.items()))
            elif args.keys_command in ("grant", "ungrant"):
                try:
                    if args.keys_command == "grant":
                        await grants.grant(args.tenant, args.permission)
                        changed = True
                    else:
                        changed = await grants.revoke(args.tenant, args.permission)
                except ValueError as e:
                    sys.stderr.write(f"{e}\n")
                    return 2
                now = (await grants.list(args.tenant)).get(args.tenant, [])
                verb = "granted" if args.keys_command == "grant" else ("revoked" if changed else "did not have")
                _out(json.dumps({"tenant": args.tenant, "grants": now}) if args.json
                     else f"tenant {args.tenant} {verb} {args.permission} (effective within ops.auth.cache_ttl_s)")
            elif args.keys_command == "grants":
                listed = await grants.list(args.tenant)
                if args.json:
                    _out(json.dumps(listed))
                else:
                    for tenant, perms in listed.items():
                        _out(f"{tenant}\t{','.join(perms)}")
            elif args.keys_command == "create":
                plain, rec = await store.create(args.tenant, args.name)
                if args.json:
                    _out(json.dumps({"key": plain, **rec.public()}))
                else:
                    _out(f"{plain}\n# id {rec.id}  tenant {rec.tenant}  (shown once: store it now)")
            elif args.keys_command == "list":
                recs = await store.list(args.tenant)
                if args.json:
                    _out(json.dumps([r.public() for r in recs]))
                else:
                    for r in recs:
                        p = r.public()
                        _out(f"{p['id']}\t{p['tenant']}\t{p['status']}\t{p['name']}")
            else:
                try:
                    rec = await store.revoke(args.key_id)
                except KeyNotFound:
                    sys.stderr.write(f"no key with id {args.key_id!r} (see `nextguard keys list`)\n")
                    return 1
                _out(json.dumps(rec.public()) if args.json else f"revoked {rec.id} (tenant {rec.tenant})")
            return 0
        finally:
            await client.aclose()

    return asyncio.run(run())


def add_subcommands(subparsers: Any) -> None:
    keys = subparsers.add_parser("keys", help="API keys (stored hashed in Redis; the tenant comes from the key)")
    keys.add_argument("--redis-url", default=None, help="default: NEXTGUARD_REDIS__URL or the settings default")
    keys.add_argument("--prefix", default=None, help="Redis key prefix (default: NEXTGUARD_REDIS__KEY_PREFIX)")
    keys.add_argument("--json", action="store_true", help="machine-readable output")
    ks = keys.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="create a key for a tenant; prints the key once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--name", default="", help="a label for the key (who or what uses it)")
    ls = ks.add_parser("list", help="list keys (ids, tenants, status; never the keys)")
    ls.add_argument("--tenant", default=None)
    r = ks.add_parser("revoke", help="revoke a key by its id (effective within ops.auth.cache_ttl_s)")
    r.add_argument("key_id")
    from gateway.ops.tenants import GRANTS

    for name, text in (
        ("grant", "grant a tenant a permission; guard_disable: its requests may send guard.enabled=false "
                  "(each such request is audited)"),
        ("ungrant", "take a permission back (effective within ops.auth.cache_ttl_s)"),
    ):
        g = ks.add_parser(name, help=text)
        g.add_argument("--tenant", required=True)
        g.add_argument("permission", choices=GRANTS)
    gl = ks.add_parser("grants", help="list the permissions granted to tenants")
    gl.add_argument("--tenant", default=None)
    q = ks.add_parser("quota", help="set a tenant's own jobs-API quotas (the suites.tenant_max_* settings it "
                                    "does not share); 'default' puts one back to the setting; no value: show them")
    q.add_argument("--tenant", required=True)
    for flag, name, what in (("--max-files", "tenant_max_files", "uploaded files it may keep"),
                             ("--max-file-bytes", "tenant_max_file_bytes", "total bytes of its uploads"),
                             ("--max-queued-jobs", "tenant_max_queued_jobs",
                              "suite runs and batches it may have queued or running")):
        q.add_argument(flag, dest=name, type=_quota_value, default=None, metavar="N|default",
                       help=f"{what} (otherwise suites.{name})")
    ql = ks.add_parser("quotas", help="list the tenants that have quotas of their own")
    ql.add_argument("--tenant", default=None)
    keys.set_defaults(func=_keys)


def add_bench_subcommands(bench_subparsers: Any) -> None:
    from gateway.loadbench import add_arguments, main

    b = bench_subparsers.add_parser(
        "load", help="reliability: N concurrent streams for a bounded time, then a disconnect storm"
    )
    add_arguments(b)
    b.set_defaults(func=main)
