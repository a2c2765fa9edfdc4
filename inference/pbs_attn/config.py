"""Settings for PBS-Attn; the lead nests :class:`PBSSettings` into the tree as ``inference.pbs``."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PBSSettings(BaseModel):
    """How prefill attention runs (``NEXTGUARD_INFERENCE__PBS__*`` once nested)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention: Literal["dense", "pbs"] = Field(
        "dense",
        description="'pbs' turns on permuted block-sparse prefill for prompts of at least min_len tokens.",
    )
    threshold: float = Field(
        0.9, gt=0.0, le=1.0, description="Proxy attention mass τ per (head, query block); 1.0 means dense."
    )
    segment_size: int = Field(256, gt=0, description="Permutation segment S (multiple of block_size).")
    block_size: int = Field(128, gt=0, description="Selection block B (also the logical kernel tile).")
    min_len: int = Field(
        16384,
        ge=0,
        description=(
            "Length gate: shorter prefills run dense. The paper's GPU op only wins from ~16K; on CPU the "
            "compiled path wins earlier but selection overhead and compile warm-up make short prompts a wash."
        ),
    )
    gqa: Literal["shared", "replicated"] = Field(
        "shared", description="One permutation per KV head ('shared', paper App. G) or per query head."
    )

    @model_validator(mode="after")
    def _segment_multiple_of_block(self) -> Self:
        if self.segment_size % self.block_size != 0:
            raise ValueError(
                f"segment_size ({self.segment_size}) must be a multiple of block_size ({self.block_size})"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.attention == "pbs"
