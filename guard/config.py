"""``GuardSettings``: the guard's part of the settings tree (nested as ``guard`` by the gateway, so the
environment spells it ``NEXTGUARD_GUARD__ENABLED=false``, ``NEXTGUARD_GUARD__MONITORED=base``, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from guard.api import GuardPolicy

DEFAULT_ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"


class GuardSettings(BaseModel):
    """How the NExT-Guard monitor is built and run; per-request policy may narrow it."""

    enabled: bool = Field(default=True, description="Put the monitor in every stream by default.")
    artifacts_dir: Path = Field(default=DEFAULT_ARTIFACTS_DIR, description="Output of `nextguard guard build`.")
    monitored: Literal["lora", "base"] = Field(
        default="lora", description="Read activations from the LoRA safeguard (paper) or the base model itself.")
    base_model: str | None = Field(
        default=None, description="Override the manifest's base model (HF folder or id); None = as built.")
    device: str = Field(default="cpu")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="The monitored network's dtype; None = float32 (scores that do not depend on the "
        "batch); bfloat16 is faster where the CPU has it natively.")
    hold_back: int = Field(default=1, ge=1, description="Generated tokens withheld until scored (>= 1).")
    score_open_tail: bool = Field(
        default=True, description="Also score the answer's unfinished last word (re-read once it is finished), so "
        "text leaves as soon as the text so far is scored instead of waiting for the next word; false = release "
        "only text whose guard tokens can no longer change.")
    prompt_threshold: float | None = Field(default=None, description="Override the calibrated prompt gate.")
    response_threshold: float | None = Field(default=None, description="Override the calibrated response gate.")
    prompt_budget: float | None = Field(
        default=None, ge=0.0, lt=1.0, description="Share of benign prompts (calibration split) the prompt gate may "
        "refuse; sets the threshold from the build's benign scores. None = the build's default (2%).")
    response_budget: float | None = Field(
        default=None, ge=0.0, lt=1.0, description="Share of full-length benign answers (calibration split) the "
        "response gate may cut. None = the build's default (2%).")
    fail_closed: bool = Field(default=True, description="Cut the stream when the guard itself fails.")
    max_batch: int = Field(default=16, ge=1, le=256, description="Streams stepped together per forward.")
    slot_wait_s: float = Field(
        default=30.0, gt=0, description="Longest a prompt or a stream waits for one of the max_batch guard slots "
        "(shared round-robin between tenants). Past it the prompt gate answers 503 guard_busy and a stream ends "
        "with finish_reason content_filter (decision guard_busy): never unscored, whatever fail_closed says.")
    max_len: int = Field(default=8192, ge=64, description="Guard context limit per stream (tokens).")
    norm_ratio: float = Field(default=10.0, gt=1.0, description="Causal norm filter: drop tokens above ratio x median.")
    threads: int = Field(default=1, ge=1, description="torch threads of the guard's executor.")
    prompt_gate: bool = Field(default=True, description="Score the prompt before generation (HTTP 400 on a hit).")
    prefix_cache: int = Field(
        default=4, ge=0, le=64,
        description="Conversation starts whose guard keys, values and scores are kept, so a request opening with "
                    "the same tokens (a deployment's system message) does not forward them again; 0 turns it off.",
    )
    prompt_views: bool = Field(
        default=True,
        description="Besides the whole conversation, score each user message, tool result and prefill alone "
                    "(the latest 8) and the user messages and tool results joined (refuse if any crosses), so a "
                    "system message, a tool result's framing or a split request cannot thin an unsafe request out.",
    )

    @model_validator(mode="after")
    def _check(self) -> GuardSettings:
        if self.enabled and not (self.artifacts_dir / "manifest.json").is_file():
            raise ValueError(
                f"guard enabled but {self.artifacts_dir}/manifest.json is missing: run `nextguard guard build` "
                "or set NEXTGUARD_GUARD__ENABLED=false"
            )
        return self

    def default_policy(self) -> GuardPolicy:
        return GuardPolicy(enabled=self.enabled, prompt_threshold=self.prompt_threshold,
                           response_threshold=self.response_threshold, hold_back=self.hold_back,
                           fail_closed=self.fail_closed)
