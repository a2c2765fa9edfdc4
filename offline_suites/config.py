"""Settings of the suite platform. The lead nests :class:`SuiteSettings` as ``Settings.suites``
(env ``NEXTGUARD_SUITES__*``); the Redis URL lives at the root (``settings.redis.url``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inference.config import InferenceSettings

# The worker sends a batch line, or a model call of a suite run, with the operator key and this header naming
# the tenant that submitted the job; the gateway then serves it as that tenant (its policy, quotas and audit
# attribution). The gateway honours the header from the operator key only.
TENANT_HEADER = "X-NextGuard-Tenant"


def _default_results_dir() -> Path:
    home = Path(os.environ.get("NEXTGUARD_HOME", Path.home() / ".cache" / "nextguard"))
    return home / "suite-results"


class SuiteSettings(BaseModel):
    """Offline suites: queue, worker, storage and how suites reach the served model."""

    results_dir: Path = Field(default_factory=_default_results_dir,
                              description="artifacts (PNG/JSON) per run, uploaded batch files and batch outputs")
    key_prefix: str = Field("nextguard:suites:", description="every Redis key of the platform starts with this")
    llm_backend: Literal["engine", "api"] = Field(
        "engine", description="'engine': in-process EngineClient (co-located worker); "
                              "'api': the gateway's public OpenAI API at api_base_url. Runs submitted over the "
                              "jobs API always use the gateway's API, as their submitter, so the guard sees them")
    api_base_url: str = Field("http://127.0.0.1:8000/v1",
                              description="gateway OpenAI base URL (api backend, batches, runs from the jobs API)")
    api_key: str = Field("EMPTY", description="bearer token for api_base_url: the operator key (ops.auth.admin_key) "
                                              "where the gateway has auth on, so jobs can run as their tenant")
    api_model: str | None = Field(None, description="model id to request; None = first of GET /v1/models")
    max_tries: int = Field(3, ge=1, le=20, description="attempts per run (transient errors, lost workers)")
    retry_backoff_s: float = Field(2.0, ge=0, description="first retry delay; doubles per attempt (cap 60 s)")
    job_timeout_s: int = Field(3600, ge=1, description="a run is killed (and retried) after this long")
    max_jobs: int = Field(1, ge=1, description="concurrent runs per worker process (suites are CPU-bound)")
    keep_runs_s: int = Field(7 * 86400, ge=60, description="TTL of run records in Redis")
    poll_interval_s: float = Field(0.5, gt=0, description="how often a running job flushes progress / reads cancel")
    batch_concurrency: int = Field(4, ge=1, description="in-flight requests per batch against the gateway")
    max_batch_lines: int = Field(50_000, ge=1, description="OpenAI's limit per batch input file")
    tenant_max_files: int = Field(100, ge=1, description="uploaded files one tenant may keep; over it -> 429")
    tenant_max_file_bytes: int = Field(1 << 30, ge=1, description="total bytes of one tenant's uploads; over it -> 429")
    tenant_max_queued_jobs: int = Field(
        16, ge=1, description="suite runs and batches one tenant may have queued or running; over it -> 429")
    engine_dtype: Literal["inherit", "float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the in-process engine of a worker or CLI run ('inherit': inference.dtype). "
                               "fp32 by default: a suite's verdict is read from its seeds, and with bf16 CPU kernels "
                               "a sampled token depends on which requests share an engine step")

    @model_validator(mode="after")
    def _check(self) -> SuiteSettings:
        if not self.key_prefix or self.key_prefix.endswith("*"):
            raise ValueError("suites.key_prefix must be non-empty and must not contain glob characters")
        return self


class _RedisURL(BaseModel):
    url: str = "redis://127.0.0.1:6379/0"


class SuitesEnv(BaseSettings):
    """The slice of the root settings tree a worker or CLI run needs, read from the same env vars
    (``NEXTGUARD_REDIS__URL``, ``NEXTGUARD_INFERENCE__*``, ``NEXTGUARD_SUITES__*``) without importing
    the gateway (layering: suites sit below it)."""

    model_config = SettingsConfigDict(env_prefix="NEXTGUARD_", env_nested_delimiter="__", env_ignore_empty=True,
                                      extra="ignore")

    redis: _RedisURL = Field(default_factory=_RedisURL)
    suites: SuiteSettings = Field(default_factory=SuiteSettings)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)


def suite_engine_settings(inference: InferenceSettings, suites: SuiteSettings) -> InferenceSettings:
    """The engine settings of a suite worker's (or CLI run's) in-process engine: ``inference`` with the
    suites' dtype."""
    if suites.engine_dtype == "inherit":
        return inference
    return inference.model_copy(update={"dtype": suites.engine_dtype})
