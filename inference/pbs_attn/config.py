"""Settings for PBS-Attn; the lead nests :class:`PBSSettings` into the tree as ``inference.pbs``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# A layer's τ: one for all its query heads, or one per query head (a head at 1.0 selects every block).
LayerTau = float | tuple[float, ...]


def _bad_tau(tau: LayerTau) -> bool:
    taus = (tau,) if isinstance(tau, int | float) else tau
    return not taus or not all(0.0 < t <= 1.0 for t in taus)


def tau_floor(tau: float | Sequence[float]) -> float:
    """The smallest τ of a scalar or per-head τ (>= 1 on every head means dense)."""
    return float(tau) if isinstance(tau, int | float) else min(float(t) for t in tau)


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
    dense_layers: tuple[int, ...] = Field(
        (),
        description=(
            "Decoder layer indices that always prefill dense. Mean-pooled selection loses attention mass on "
            "some early-layer heads (the paper's harmed heads cluster in layers 3-6); "
            "`python -m inference.pbs_attn.bench --calibrate` measures which layers fall below a recall floor."
        ),
    )

    @model_validator(mode="after")
    def _segment_multiple_of_block(self) -> Self:
        if self.segment_size % self.block_size != 0:
            raise ValueError(
                f"segment_size ({self.segment_size}) must be a multiple of block_size ({self.block_size})"
            )
        return self

    layer_thresholds: dict[int, LayerTau] = Field(
        default_factory=dict,
        description=(
            "Per-layer τ overrides (layer index -> τ in (0, 1], or a list with one τ per query head; 1.0 = "
            "dense), for layers whose recall at the global τ falls below the floor; the benchmark's "
            "calibration writes them."
        ),
    )

    length_thresholds: dict[int, dict[int, LayerTau]] = Field(
        default_factory=dict,
        description=(
            "Per-length τ overrides {min_tokens: {layer: τ}}: a prefill of N tokens applies, on top of "
            "layer_thresholds, the bucket with the largest min_tokens <= N. Attention spreads differently at "
            "longer contexts (more so under RoPE scaling), so a policy calibrated at one length may not hold "
            "at another; the benchmark's calibration writes one bucket per calibrated length."
        ),
    )

    @field_validator("length_thresholds", mode="before")
    @classmethod
    def _length_thresholds_from_text(cls, v: object) -> object:
        # env form: a JSON object, e.g. '{"32768": {"4": 0.99}}'
        if isinstance(v, str):
            import json

            return json.loads(v) if v.strip() else {}
        return v

    @field_validator("layer_thresholds", mode="before")
    @classmethod
    def _thresholds_from_text(cls, v: object) -> object:
        # env form: "4:0.98,7:1.0", or a JSON object (needed for per-head lists: '{"4": [0.99, 0.98, ...]}')
        if isinstance(v, str) and "[" in v:
            import json

            return json.loads(v)
        if isinstance(v, str):
            text = v.strip().strip("{}")
            pairs = [x.split(":") for x in text.replace(" ", "").replace('"', "").split(",") if x]
            return {int(k): float(t) for k, t in pairs}
        return v

    @field_validator("dense_layers", mode="before")
    @classmethod
    def _layers_from_text(cls, v: object) -> object:
        # The vLLM worker reads these settings from plain env vars: accept "4,5" and "[4, 5]" too.
        if isinstance(v, str):
            text = v.strip().strip("[]()")
            return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        return v

    @model_validator(mode="after")
    def _layers_non_negative(self) -> Self:
        if any(i < 0 for i in self.dense_layers):
            raise ValueError(f"dense_layers must be layer indices >= 0, got {self.dense_layers}")
        bad = {i: t for i, t in self.layer_thresholds.items() if i < 0 or _bad_tau(t)}
        if bad:
            raise ValueError(f"layer_thresholds needs layer >= 0 and 0 < τ <= 1, got {bad}")
        bad_len = {
            n: {i: t for i, t in b.items() if i < 0 or _bad_tau(t)}
            for n, b in self.length_thresholds.items()
        }
        bad_len = {n: b for n, b in bad_len.items() if b or n < 0}
        if bad_len:
            raise ValueError(f"length_thresholds needs min_tokens >= 0, layer >= 0 and 0 < τ <= 1, got {bad_len}")
        return self

    @property
    def enabled(self) -> bool:
        return self.attention == "pbs"

    def threshold_for(self, layer_idx: int | None, n: int | None = None) -> LayerTau:
        """τ for this layer at prefill length ``n``: 1.0 (dense) for an opted-out layer, else the override of
        the length bucket for ``n`` (largest ``min_tokens <= n``), else its layer override, else the global τ.
        ``n=None`` ignores the length buckets. A tuple is one τ per query head."""
        if layer_idx is None:
            return self.threshold
        if layer_idx in self.dense_layers:
            return 1.0
        if n is not None:
            buckets = [m for m in self.length_thresholds if m <= n]
            if buckets:
                tau = self.length_thresholds[max(buckets)].get(layer_idx)
                if tau is not None:
                    return tau
        return self.layer_thresholds.get(layer_idx, self.threshold)

    def layer_enabled(self, layer_idx: int | None) -> bool:
        """PBS may run on this layer at some length (an unknown index counts as not opted out); the τ for a
        given prefill comes from :meth:`threshold_for`, and τ >= 1 there means dense."""
        if not self.enabled or layer_idx in self.dense_layers:
            return False
        taus = [self.threshold_for(layer_idx)]
        taus += [b[layer_idx] for b in self.length_thresholds.values() if layer_idx is not None and layer_idx in b]
        return min(tau_floor(t) for t in taus) < 1.0
