"""Suite runs as Redis-queued jobs (arq): idempotent submission, lifecycle, progress, cancel, retries.

Lifecycle of a run record (a Redis hash ``<prefix>run:<id>``)::

    queued ──> running ──> succeeded
      │           ├──────> failed      (deterministic error, or tries exhausted)
      │           ├──────> cancelled   (cancel requested; the suite stops at its next progress call)
      │           └──────> queued      (transient error: retried with backoff, at most max_tries)
      └──────────────────> cancelled

The run id is ``sha256(suite, version, canonical config, seed)``: submitting the same run twice
returns the existing record unless it failed or was cancelled (then it is queued again).
A worker that dies mid-run leaves arq's in-progress key to expire (job timeout + 10 s); the job is
then redelivered and the record continues as attempt n + 1 — retried, not lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import traceback
from enum import StrEnum
from pathlib import Path
from typing import Any

from offline_suites.base import SuiteCancelled, build_config, canonical_config
from offline_suites.config import SuiteSettings
from offline_suites.keys import Keys
from offline_suites.registry import get_suite

RUN_FUNCTION = "run_suite"


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class RunNotFound(KeyError):
    pass


class TransientError(RuntimeError):
    """Raise from a suite for failures worth retrying (the worker also retries connection errors)."""


def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [TransientError, ConnectionError, TimeoutError]
    try:
        import openai

        types += [openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError]
    except ImportError:
        pass
    try:
        from inference.engine import EngineError

        types.append(EngineError)
    except ImportError:
        pass
    return tuple(types)


def run_id_for(suite: str, version: int, config: Any, seed: int) -> str:
    payload = json.dumps([suite, version, canonical_config(config), seed], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


# ------------------------------------------------------------------------------------ record store
_JSON_FIELDS = ("config", "overrides", "result", "artifacts")


RECORD_FILE = "run.json"


class RunStore:
    """Run records as Redis hashes (field-level updates are atomic; no read-modify-write races).

    With ``results_dir`` the record of a finished run (status, config, error, result with its checks,
    claims and provenance) is also written to ``<results_dir>/<run id>/run.json`` next to its artifacts,
    and read back from there once the Redis hash has expired (``keep_runs_s``): the verdicts outlive the TTL.
    """

    def __init__(self, redis: Any, keys: Keys, ttl_s: int, results_dir: Path | None = None) -> None:
        self.redis, self.keys, self.ttl_s, self.results_dir = redis, keys, ttl_s, results_dir

    def _record_path(self, run_id: str) -> Path | None:
        # run ids are hex digests (scoped ones too); anything else never names a file
        if self.results_dir is None or not run_id or not all(c in "0123456789abcdef" for c in run_id):
            return None
        return self.results_dir / run_id / RECORD_FILE

    def _read_disk(self, run_id: str) -> dict[str, Any] | None:
        path = self._record_path(run_id)
        if path is None or not path.is_file():
            return None
        rec: dict[str, Any] = json.loads(path.read_text())
        return rec

    async def _write_disk(self, run_id: str) -> None:
        path = self._record_path(run_id)
        rec = await self.get(run_id)
        if path is None or rec is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, sort_keys=True))
        tmp.replace(path)           # atomic: a reader sees the old record or the new one

    async def get(self, run_id: str) -> dict[str, Any] | None:
        raw = await self.redis.hgetall(self.keys.run(run_id))
        if not raw:
            return self._read_disk(run_id)
        rec: dict[str, Any] = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                               for k, v in raw.items()}
        for f in _JSON_FIELDS:
            if f in rec:
                rec[f] = json.loads(rec[f])
        for f in ("progress", "created_at", "started_at", "finished_at"):
            if f in rec and rec[f] != "":
                rec[f] = float(rec[f])
        for f in ("attempts", "seed", "version"):
            if f in rec:
                rec[f] = int(rec[f])
        rec["cancel_requested"] = rec.get("cancel_requested") == "1"
        return rec

    async def set(self, run_id: str, **fields: Any) -> None:
        enc = {k: (json.dumps(v) if k in _JSON_FIELDS else ("1" if v is True else "0" if v is False else
                                                              "" if v is None else str(v)))
               for k, v in fields.items()}
        key = self.keys.run(run_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=enc)
            pipe.expire(key, self.ttl_s)
            await pipe.execute()
        if "status" in fields and JobStatus(fields["status"]).terminal:
            await self._write_disk(run_id)

    async def list(self, limit: int = 20, after: str | None = None) -> list[dict[str, Any]]:
        ids = [i.decode() if isinstance(i, bytes) else i for i in await self.redis.zrevrange(self.keys.runs_index, 0, -1)]
        if after is not None and after in ids:
            ids = ids[ids.index(after) + 1:]
        out = []
        for rid in ids:
            rec = await self.get(rid)
            if rec is None:          # expired record: drop it from the index
                await self.redis.zrem(self.keys.runs_index, rid)
                continue
            out.append(rec)
            if len(out) >= limit:
                break
        return out


def public_view(rec: dict[str, Any], *, include_result: bool = True) -> dict[str, Any]:
    """The run object the API returns."""
    out = {"id": rec["id"], "object": "suite.run", "suite": rec["suite"], "version": rec["version"],
           "preset": rec["preset"], "seed": rec["seed"], "config": rec["config"], "status": rec["status"],
           "progress": rec.get("progress", 0.0), "message": rec.get("message", ""),
           "attempts": rec.get("attempts", 0), "cancel_requested": rec.get("cancel_requested", False),
           "error": rec.get("error") or None, "created_at": rec.get("created_at"),
           "started_at": rec.get("started_at") or None, "finished_at": rec.get("finished_at") or None,
           "artifacts": rec.get("artifacts", [])}
    if include_result:
        out["result"] = rec.get("result")
    return out


# ------------------------------------------------------------------------------------- submission
def job_serializer(job: dict[str, Any]) -> bytes:
    """arq's job and result records as JSON. arq's default is pickle, and unpickling what Redis holds runs
    whatever code anyone who can write Redis put there, in the worker. Our job arguments are ids (str)."""
    return json.dumps(job, separators=(",", ":"), default=str).encode()


def job_deserializer(raw: bytes) -> dict[str, Any]:
    out = json.loads(raw)
    if not isinstance(out, dict):
        raise ValueError("an arq job record must be a JSON object")
    return out


def arq_pool(redis: Any) -> Any:
    """An ArqRedis sharing the given client's connection pool (arq needs its subclass to enqueue), with the
    JSON job serializer the workers read."""
    from arq.connections import ArqRedis

    return ArqRedis(connection_pool=redis.connection_pool, job_serializer=job_serializer,
                    job_deserializer=job_deserializer)


class IdempotencyConflict(ValueError):
    """An idempotency key reused for a different run."""


def scoped_run_id(owner: str, content_id: str, idempotency_key: str | None = None) -> str:
    """A run id that belongs to ``owner``: by its idempotency key when given, else by content. Never the bare
    content hash, so that a second submitter of the same run gets a run of its own, not a share of the
    first one (which it could then cancel)."""
    payload = json.dumps([owner, "key", idempotency_key] if idempotency_key is not None else [owner, content_id],
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def submission_run_id(suite_name: str, preset: str = "smoke", overrides: dict[str, Any] | None = None,
                      seed: int = 0, *, owner: str | None = None, idempotency_key: str | None = None) -> str:
    """The id :func:`submit_run` gives this submission (so a quota can be reserved before it is queued)."""
    suite = get_suite(suite_name)
    content_id = run_id_for(suite.name, suite.version, build_config(suite.config_cls, preset, overrides), seed)
    return content_id if owner is None else scoped_run_id(owner, content_id, idempotency_key)


async def submit_run(redis: Any, settings: SuiteSettings, suite_name: str, preset: str = "smoke",
                     overrides: dict[str, Any] | None = None, seed: int = 0, *, owner: str | None = None,
                     idempotency_key: str | None = None) -> tuple[dict[str, Any], bool]:
    """Queue a run; returns (record, created). Idempotent on (suite, version, config, seed), within ``owner``
    when given (see :func:`scoped_run_id`); with ``idempotency_key`` on that key, and reusing it for another
    run raises :class:`IdempotencyConflict`."""
    from arq.constants import job_key_prefix, result_key_prefix, retry_key_prefix

    suite = get_suite(suite_name)
    config = build_config(suite.config_cls, preset, overrides)
    content_id = run_id_for(suite.name, suite.version, config, seed)
    run_id = content_id if owner is None else scoped_run_id(owner, content_id, idempotency_key)
    keys = Keys(settings.key_prefix)
    store = RunStore(redis, keys, settings.keep_runs_s, settings.results_dir)
    existing = await store.get(run_id)
    if existing is not None and existing.get("content_id", content_id) != content_id:
        raise IdempotencyConflict(
            f"this Idempotency-Key was already used for another run ({existing['suite']}, seed {existing['seed']}); "
            "use a new key for a new run")
    if existing is not None and JobStatus(existing["status"]) not in (JobStatus.failed, JobStatus.cancelled):
        return existing, False
    import dataclasses

    now = time.time()
    await redis.delete(keys.cancel(run_id))
    job_id = keys.job_id(run_id)
    # a previous failed/cancelled attempt may have left arq bookkeeping behind
    await redis.delete(job_key_prefix + job_id, result_key_prefix + job_id, retry_key_prefix + job_id)
    await store.set(run_id, id=run_id, content_id=content_id, owner=owner or "", suite=suite.name, version=suite.version, preset=preset, seed=seed,
                    config=dataclasses.asdict(config), overrides=overrides or {}, status=JobStatus.queued.value,
                    progress=0.0, message="queued", attempts=0, error="", result=None, artifacts=[],
                    cancel_requested=False, created_at=now, started_at="", finished_at="")
    await redis.zadd(keys.runs_index, {run_id: now})
    job = await arq_pool(redis).enqueue_job(RUN_FUNCTION, run_id, _job_id=job_id, _queue_name=keys.queue)
    if job is None:
        # arq still holds this job id (queued or in progress): the record above is what it will run
        pass
    rec = await store.get(run_id)
    assert rec is not None
    return rec, True


async def cancel_run(redis: Any, settings: SuiteSettings, run_id: str) -> dict[str, Any]:
    keys = Keys(settings.key_prefix)
    store = RunStore(redis, keys, settings.keep_runs_s, settings.results_dir)
    rec = await store.get(run_id)
    if rec is None:
        raise RunNotFound(run_id)
    status = JobStatus(rec["status"])
    if status.terminal:
        return rec
    await redis.set(keys.cancel(run_id), "1", ex=settings.keep_runs_s)
    if status is JobStatus.queued:
        # nobody is running it: final right away; a worker that dequeues it later sees the flag
        await store.set(run_id, status=JobStatus.cancelled.value, cancel_requested=True, message="cancelled",
                        finished_at=time.time())
    else:
        await store.set(run_id, cancel_requested=True, message="cancelling")
    rec = await store.get(run_id)
    assert rec is not None
    return rec


# ------------------------------------------------------------------------------------ the arq job
def _llm_factory(ctx: dict[str, Any], settings: SuiteSettings, owner: str | None) -> Any:
    """How a run reaches the model. A run submitted over the jobs API (it has an owner) carries client text
    (suite configs put it into prompts), so it goes through the gateway's public API as its submitter: the
    prompt gate reads what is sent, the response gate what comes back, under that tenant's policy, quotas
    and audit attribution. The worker's own door (the in-process engine, which has no guard) serves only runs
    queued without an owner, which only the operator's own code can do."""
    if owner is None:
        return ctx.get("llm_factory")
    from offline_suites.llm import build_openai_client

    return lambda: build_openai_client(settings, tenant=owner)


async def run_suite_job(ctx: dict[str, Any], run_id: str) -> str:
    """arq function: execute one run in a thread, mirroring progress/cancel through Redis."""
    from arq.worker import Retry

    from offline_suites.base import RunContext

    settings: SuiteSettings = ctx["suite_settings"]
    redis = ctx["redis"]
    keys = Keys(settings.key_prefix)
    store = RunStore(redis, keys, settings.keep_runs_s, settings.results_dir)
    rec = await store.get(run_id)
    if rec is None:
        return "missing"
    if JobStatus(rec["status"]).terminal:
        return rec["status"]
    if await redis.exists(keys.cancel(run_id)):
        await store.set(run_id, status=JobStatus.cancelled.value, message="cancelled", finished_at=time.time())
        return "cancelled"
    attempt = int(ctx.get("job_try", 1))
    if attempt > settings.max_tries:
        # arq is configured with one spare try so that *we* record the give-up (e.g. after the
        # worker running the last try was killed), instead of leaving the record at "running".
        await store.set(run_id, status=JobStatus.failed.value, finished_at=time.time(),
                        error=f"gave up after {settings.max_tries} attempts (last: {rec.get('error') or 'worker lost'})")
        return "failed"
    await store.set(run_id, status=JobStatus.running.value, attempts=attempt, started_at=time.time(),
                    message=f"attempt {attempt}")

    suite = get_suite(rec["suite"])
    config = build_config(suite.config_cls, rec["preset"], rec.get("overrides") or None)
    results_dir = settings.results_dir / run_id
    cancel = threading.Event()
    run_ctx = RunContext(results_dir=results_dir, llm_factory=_llm_factory(ctx, settings, rec.get("owner") or None),
                         cancel_event=cancel,
                         model_path_factory=ctx.get("model_path_factory"))
    task = asyncio.ensure_future(asyncio.to_thread(suite.run, run_ctx, config, int(rec["seed"])))
    last = (-1.0, "")
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=settings.poll_interval_s)
            if await redis.exists(keys.cancel(run_id)):
                cancel.set()
            now = (run_ctx.progress_value, run_ctx.progress_message)
            if now != last:
                await store.set(run_id, progress=now[0], message=now[1])
                last = now
        result = task.result()
    except SuiteCancelled:
        await store.set(run_id, status=JobStatus.cancelled.value, message="cancelled", finished_at=time.time(),
                        artifacts=run_ctx.artifacts)
        return "cancelled"
    except _transient_types() as exc:
        err = f"{type(exc).__name__}: {exc}"
        if attempt < settings.max_tries:
            await store.set(run_id, status=JobStatus.queued.value, error=err, message=f"retrying after: {err}")
            raise Retry(defer=min(settings.retry_backoff_s * 2 ** (attempt - 1), 60.0)) from exc
        await store.set(run_id, status=JobStatus.failed.value, error=err, finished_at=time.time())
        return "failed"
    except Exception as exc:
        tb = "".join(traceback.format_exception(exc))[-4000:]
        await store.set(run_id, status=JobStatus.failed.value, error=f"{type(exc).__name__}: {exc}\n{tb}",
                        finished_at=time.time())
        return "failed"
    finally:
        if not task.done():
            # arq cancelled us (timeout, shutdown): stop the thread at its next progress call
            cancel.set()
    body = result.to_dict()
    await store.set(run_id, status=JobStatus.succeeded.value, progress=1.0, message="done", result=body,
                    artifacts=body["artifacts"], finished_at=time.time(), error="")
    return "succeeded"
