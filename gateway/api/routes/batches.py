"""OpenAI Batch API: ``/v1/files`` (purpose=batch) and ``/v1/batches``. Lines are executed by the
suite workers, which POST each one to this gateway's public API so it takes the guarded path
(see ``offline_suites.batch``).

Files and batches belong to the tenant that created them (``gateway.ops.auth.OwnerStore``, kinds ``file`` and
``batch``): any other tenant gets the same 404 an unknown id gets, and listings show only the caller's
batches. A batch's output and error files are written by a worker, so they are claimed for the batch's
owners when the batch object that names them is read."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from gateway.api.routes.suites import quota_error, quotas, redis_client, suite_settings
from gateway.errors import OpenAIError
from gateway.ops.auth import OwnersDep, OwnerStore, Principal, PrincipalDep
from offline_suites import batch as B
from offline_suites.quotas import QuotaExceeded

router = APIRouter()


class BatchRequest(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None)


@router.post("/v1/files")
async def files_create(request: Request, principal: PrincipalDep, owners: OwnersDep, file: UploadFile = File(...),
                       purpose: str = Form(...)) -> dict[str, Any]:
    """Upload a JSONL batch input file."""
    if purpose != "batch":
        raise OpenAIError(400, f"Unsupported purpose {purpose!r}: this server accepts only purpose='batch'.",
                          param="purpose", code="invalid_purpose")
    data = await file.read()
    s = suite_settings(request)
    try:
        B.parse_batch_file(data, _first_url(data), s.max_batch_lines)
    except B.BatchInputError as e:
        raise OpenAIError(400, f"Invalid batch file: {e}", param="file", code="invalid_file") from e
    except UnicodeDecodeError as e:
        raise OpenAIError(400, "Invalid batch file: not UTF-8", param="file", code="invalid_file") from e
    fid, q = B.new_id("file"), quotas(request)
    try:
        await q.reserve_file(principal.tenant, fid, len(data))
    except QuotaExceeded as e:
        raise quota_error(e) from e
    try:
        f = await B.store_file(redis_client(request), s, data, file.filename or "batch.jsonl", purpose, file_id=fid)
    except BaseException:
        await q.release_file(principal.tenant, fid)
        raise
    await owners.claim("file", f["id"], principal)
    return f


def _first_url(data: bytes) -> str:
    import json

    for raw in data.decode("utf-8").splitlines():
        if raw.strip():
            try:
                url = json.loads(raw).get("url")
            except (json.JSONDecodeError, AttributeError):
                return ""
            return url if url in B.ENDPOINTS else ""
    return ""


def _file_not_found(file_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file_id}", param="file_id", code="file_not_found")


def _batch_not_found(batch_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such batch: {batch_id}", param="batch_id", code="batch_not_found")


async def _file(request: Request, file_id: str, principal: Principal, owners: OwnerStore) -> dict[str, Any]:
    await owners.check("file", file_id, principal, _file_not_found(file_id))
    f = await B.get_file(redis_client(request), suite_settings(request), file_id)
    if f is None:
        raise _file_not_found(file_id)
    return f


async def _claim_outputs(b: dict[str, Any], principal: Principal, owners: OwnerStore) -> dict[str, Any]:
    """The worker writes a batch's output/error files without knowing the tenant: whoever may read the
    batch may read the files it names."""
    for key in ("output_file_id", "error_file_id"):
        if b.get(key) and not await owners.owns("file", b[key], principal):
            await owners.claim("file", b[key], principal)
    return b


@router.get("/v1/files/{file_id}")
async def files_get(file_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """File metadata."""
    return await _file(request, file_id, principal, owners)


@router.get("/v1/files/{file_id}/content")
async def files_content(file_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> FileResponse:
    """File bytes (batch input, output or error JSONL)."""
    await _file(request, file_id, principal, owners)
    return FileResponse(B.file_path(suite_settings(request), file_id), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def files_delete(file_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """Delete a file (record and bytes); it stops counting against the tenant's upload quota."""
    await _file(request, file_id, principal, owners)       # another tenant's file: 404, as unknown
    if not await B.delete_file(redis_client(request), suite_settings(request), file_id):
        raise _file_not_found(file_id)
    await quotas(request).release_file(principal.tenant, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/v1/batches")
async def batches_create(body: BatchRequest, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """Create a batch from an uploaded file; it starts in ``validating``."""
    if body.endpoint not in B.ENDPOINTS:
        raise OpenAIError(400, f"Unsupported endpoint {body.endpoint!r}. Available: {', '.join(B.ENDPOINTS)}",
                          param="endpoint", code="invalid_endpoint")
    if body.completion_window != "24h":
        raise OpenAIError(400, "completion_window must be '24h'", param="completion_window")
    f = await _file(request, body.input_file_id, principal, owners)   # another tenant's file: 404, as unknown
    if f["purpose"] != "batch":
        raise OpenAIError(400, f"File {body.input_file_id} has purpose {f['purpose']!r}, not 'batch'",
                          param="input_file_id")
    bid, q = B.new_id("batch"), quotas(request)
    try:
        await q.reserve_job(principal.tenant, "batch", bid)
    except QuotaExceeded as e:
        raise quota_error(e) from e
    try:
        b = await B.create_batch(redis_client(request), suite_settings(request), body.input_file_id, body.endpoint,
                                 body.completion_window, body.metadata, batch_id=bid, tenant=principal.tenant)
    except BaseException:
        await q.release_job(principal.tenant, "batch", bid)
        raise
    await owners.claim("batch", b["id"], principal)
    return b


@router.get("/v1/batches")
async def batches_list(request: Request, principal: PrincipalDep, owners: OwnersDep,
                       limit: int = Query(20, ge=1, le=100), after: str | None = None) -> dict[str, Any]:
    """The caller's batches, newest first."""
    redis, s = redis_client(request), suite_settings(request)

    async def fetch(n: int, cursor: str | None) -> list[dict[str, Any]]:
        return await B.list_batches(redis, s, n, cursor)

    items = await owners.page("batch", principal, fetch, limit + 1, after)
    data = [await _claim_outputs(b, principal, owners) for b in items[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}


@router.get("/v1/batches/{batch_id}")
async def batches_get(batch_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """One batch: status, request counts, output/error file ids."""
    await owners.check("batch", batch_id, principal, _batch_not_found(batch_id))
    b = await B.get_batch(redis_client(request), suite_settings(request), batch_id)
    if b is None:
        raise _batch_not_found(batch_id)
    return await _claim_outputs(b, principal, owners)


@router.post("/v1/batches/{batch_id}/cancel")
async def batches_cancel(batch_id: str, request: Request, principal: PrincipalDep, owners: OwnersDep) -> dict[str, Any]:
    """Request cancellation; in-flight lines finish, the rest are skipped."""
    await owners.check("batch", batch_id, principal, _batch_not_found(batch_id))
    b = await B.cancel_batch(redis_client(request), suite_settings(request), batch_id)
    if b is None:
        raise _batch_not_found(batch_id)
    return await _claim_outputs(b, principal, owners)
