"""OpenAI Batch API behind the queue: files, batch records, and the worker job that runs the lines.

Design (honest about the guarded path): a batch line is executed by POSTing it to the gateway's own
public HTTP API at ``suites.api_base_url`` — the same ``/v1/chat/completions`` (or
``/v1/completions``) clients call, so every line goes through the prompt gate, the streaming guard,
metrics and rate limits. The worker never reaches into gateway internals (layering), and the
gateway process does not run batches itself (a long batch must survive API restarts and scale with
the workers). A line that the guard cuts comes back with ``finish_reason: "content_filter"`` and
the gateway's ``safety`` extension inside ``response.body``, exactly as a client would see it.

Batch status follows OpenAI: validating → in_progress → finalizing → completed, or failed,
cancelling → cancelled. Record: ``<prefix>batch:<id>`` (JSON). File bytes: ``results_dir/files/``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Any

from offline_suites.config import TENANT_HEADER, SuiteSettings
from offline_suites.keys import Keys

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


class BatchInputError(ValueError):
    """The input file is not a valid batch file; ``line`` is 1-based (None = whole file)."""

    def __init__(self, message: str, line: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.line, self.param = line, param


def new_id(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(12)}"


def files_dir(settings: SuiteSettings) -> Path:
    d = settings.results_dir / "files"
    d.mkdir(parents=True, exist_ok=True)
    return d


async def _get_json(redis: Any, key: str) -> dict[str, Any] | None:
    raw = await redis.get(key)
    return None if raw is None else json.loads(raw)


async def _put_json(redis: Any, key: str, obj: dict[str, Any], ttl: int) -> None:
    await redis.set(key, json.dumps(obj), ex=ttl)


# ------------------------------------------------------------------------------------------ files
async def store_file(redis: Any, settings: SuiteSettings, data: bytes, filename: str, purpose: str,
                     file_id: str | None = None) -> dict[str, Any]:
    fid = file_id or new_id("file")
    (files_dir(settings) / fid).write_bytes(data)
    obj = {"id": fid, "object": "file", "bytes": len(data), "created_at": int(time.time()), "filename": filename,
           "purpose": purpose, "status": "processed"}
    await _put_json(redis, Keys(settings.key_prefix).file(fid), obj, settings.keep_runs_s)
    return obj


async def get_file(redis: Any, settings: SuiteSettings, file_id: str) -> dict[str, Any] | None:
    return await _get_json(redis, Keys(settings.key_prefix).file(file_id))


async def delete_file(redis: Any, settings: SuiteSettings, file_id: str) -> bool:
    """Remove a file's record and bytes; False when there was no such file."""
    existed = bool(await redis.delete(Keys(settings.key_prefix).file(file_id)))
    file_path(settings, file_id).unlink(missing_ok=True)
    return existed


def file_path(settings: SuiteSettings, file_id: str) -> Path:
    if "/" in file_id or ".." in file_id:
        raise ValueError("bad file id")
    return files_dir(settings) / file_id


def parse_batch_file(data: bytes, endpoint: str, max_lines: int) -> list[dict[str, Any]]:
    """Validate a JSONL batch file: every line {custom_id, method: POST, url: endpoint, body}."""
    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise BatchInputError(f"line {i} is not valid JSON: {e.msg}", i) from e
        if not isinstance(obj, dict):
            raise BatchInputError(f"line {i} must be a JSON object", i)
        cid = obj.get("custom_id")
        if not isinstance(cid, str) or not cid:
            raise BatchInputError(f"line {i}: custom_id must be a non-empty string", i, "custom_id")
        if cid in seen:
            raise BatchInputError(f"line {i}: duplicate custom_id {cid!r}", i, "custom_id")
        seen.add(cid)
        if obj.get("method") != "POST":
            raise BatchInputError(f"line {i}: method must be POST", i, "method")
        if obj.get("url") != endpoint:
            raise BatchInputError(f"line {i}: url {obj.get('url')!r} does not match the batch endpoint {endpoint}",
                                  i, "url")
        if not isinstance(obj.get("body"), dict):
            raise BatchInputError(f"line {i}: body must be an object", i, "body")
        if obj["body"].get("stream"):
            raise BatchInputError(f"line {i}: stream=true is not supported in batches", i, "body.stream")
        lines.append(obj)
        if len(lines) > max_lines:
            raise BatchInputError(f"more than {max_lines} requests in one batch")
    if not lines:
        raise BatchInputError("the input file has no requests")
    return lines


# ---------------------------------------------------------------------------------------- batches
async def create_batch(redis: Any, settings: SuiteSettings, input_file_id: str, endpoint: str,
                       completion_window: str, metadata: dict[str, str] | None, *, batch_id: str | None = None,
                       tenant: str | None = None) -> dict[str, Any]:
    """Record and queue a batch. ``tenant``: who submitted it; its lines are sent as that tenant."""
    from offline_suites.jobs import arq_pool
    from offline_suites.worker import BATCH_FUNCTION

    keys = Keys(settings.key_prefix)
    bid = batch_id or new_id("batch")
    now = int(time.time())
    batch = {"id": bid, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": input_file_id,
             "completion_window": completion_window, "status": "validating", "output_file_id": None,
             "error_file_id": None, "created_at": now, "in_progress_at": None, "expires_at": now + 86400,
             "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
             "cancelling_at": None, "cancelled_at": None,
             "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata or None}
    if tenant is not None:
        await redis.set(keys.batch_tenant(bid), tenant, ex=settings.keep_runs_s)
    await _put_json(redis, keys.batch(bid), batch, settings.keep_runs_s)
    await redis.zadd(keys.batches_index, {bid: now})
    await arq_pool(redis).enqueue_job(BATCH_FUNCTION, bid, _job_id=keys.job_id(bid), _queue_name=keys.queue)
    return batch


async def get_batch(redis: Any, settings: SuiteSettings, batch_id: str) -> dict[str, Any] | None:
    return await _get_json(redis, Keys(settings.key_prefix).batch(batch_id))


async def list_batches(redis: Any, settings: SuiteSettings, limit: int, after: str | None) -> list[dict[str, Any]]:
    keys = Keys(settings.key_prefix)
    ids = [i.decode() if isinstance(i, bytes) else i for i in await redis.zrevrange(keys.batches_index, 0, -1)]
    if after in ids:
        ids = ids[ids.index(after) + 1:]
    out = []
    for bid in ids:
        b = await get_batch(redis, settings, bid)
        if b is not None:
            out.append(b)
        if len(out) >= limit:
            break
    return out


async def cancel_batch(redis: Any, settings: SuiteSettings, batch_id: str) -> dict[str, Any] | None:
    keys = Keys(settings.key_prefix)
    b = await get_batch(redis, settings, batch_id)
    if b is None or b["status"] in ("completed", "failed", "expired", "cancelled"):
        return b
    await redis.set(keys.cancel(batch_id), "1", ex=settings.keep_runs_s)
    b["status"], b["cancelling_at"] = "cancelling", int(time.time())
    await _put_json(redis, keys.batch(batch_id), b, settings.keep_runs_s)
    return b


async def run_batch_job(ctx: dict[str, Any], batch_id: str) -> str:
    """arq function: POST each line to the gateway, write output/error files, keep counts current."""
    import httpx

    settings: SuiteSettings = ctx["suite_settings"]
    redis = ctx["redis"]
    keys = Keys(settings.key_prefix)
    b = await get_batch(redis, settings, batch_id)
    if b is None:
        return "missing"

    async def save() -> None:
        await _put_json(redis, keys.batch(batch_id), b, settings.keep_runs_s)

    def fail(code: str, message: str, line: int | None = None, param: str | None = None) -> None:
        b["status"], b["failed_at"] = "failed", int(time.time())
        b["errors"] = {"object": "list", "data": [{"code": code, "message": message, "line": line, "param": param}]}

    if await redis.exists(keys.cancel(batch_id)):
        b["status"], b["cancelled_at"] = "cancelled", int(time.time())
        await save()
        return "cancelled"
    try:
        data = file_path(settings, b["input_file_id"]).read_bytes()
        lines = parse_batch_file(data, b["endpoint"], settings.max_batch_lines)
    except FileNotFoundError:
        fail("invalid_file", f"input file {b['input_file_id']} not found", param="input_file_id")
        await save()
        return "failed"
    except BatchInputError as e:
        fail("invalid_request", str(e), e.line, e.param)
        await save()
        return "failed"
    b["status"], b["in_progress_at"] = "in_progress", int(time.time())
    b["request_counts"] = {"total": len(lines), "completed": 0, "failed": 0}
    await save()

    base = settings.api_base_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    results: list[dict[str, Any] | None] = [None] * len(lines)
    sem = asyncio.Semaphore(settings.batch_concurrency)
    cancelled = False

    headers = {"Authorization": f"Bearer {settings.api_key}"}
    tenant = await redis.get(keys.batch_tenant(batch_id))
    if tenant is not None:
        # lines run as the tenant that submitted the batch, not as the worker's key (see TENANT_HEADER)
        headers[TENANT_HEADER] = tenant.decode() if isinstance(tenant, bytes) else tenant
    async with httpx.AsyncClient(timeout=settings.job_timeout_s, headers=headers) as client:
        async def one(i: int, line: dict[str, Any]) -> None:
            nonlocal cancelled
            async with sem:
                if cancelled or await redis.exists(keys.cancel(batch_id)):
                    cancelled = True
                    return
                rid = f"{batch_id}-{i}"
                try:
                    r = await client.post(root + line["url"], json=line["body"], headers={"X-Request-Id": rid})
                    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {
                        "text": r.text}
                    results[i] = {"id": f"batch_req_{rid}", "custom_id": line["custom_id"],
                                  "response": {"status_code": r.status_code,
                                               "request_id": r.headers.get("x-request-id", rid), "body": body},
                                  "error": None}
                    ok = r.status_code < 400
                except httpx.HTTPError as e:
                    results[i] = {"id": f"batch_req_{rid}", "custom_id": line["custom_id"], "response": None,
                                  "error": {"code": "connection_error", "message": f"{type(e).__name__}: {e}"}}
                    ok = False
                b["request_counts"]["completed" if ok else "failed"] += 1
                await save()

        await asyncio.gather(*(one(i, ln) for i, ln in enumerate(lines)))

    b["status"], b["finalizing_at"] = "finalizing", int(time.time())
    await save()
    ok_lines = [json.dumps(r) for r in results if r is not None and r["error"] is None and
                r["response"]["status_code"] < 400]
    err_lines = [json.dumps(r) for r in results if r is not None and (r["error"] is not None or
                                                                     r["response"]["status_code"] >= 400)]
    if ok_lines:
        b["output_file_id"] = (await store_file(redis, settings, ("\n".join(ok_lines) + "\n").encode(),
                                                f"{batch_id}_output.jsonl", "batch_output"))["id"]
    if err_lines:
        b["error_file_id"] = (await store_file(redis, settings, ("\n".join(err_lines) + "\n").encode(),
                                               f"{batch_id}_error.jsonl", "batch_output"))["id"]
    if cancelled:
        b["status"], b["cancelled_at"] = "cancelled", int(time.time())
    else:
        b["status"], b["completed_at"] = "completed", int(time.time())
    await save()
    return b["status"]
