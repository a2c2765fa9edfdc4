"""The response gate's residual probe: a second trigger that reads what the SAE does not reconstruct.

The evaluation ladder, split by evaluation group, shows where a stream that turns unsafe after a benign
answer is lost. A dense logistic probe on the served layer's residual, streamed through the gate's window,
cuts most of them; the same probe on the SAE's reconstruction (a linear function of all latents) cuts almost
none, and on the reconstruction's error it cuts most again. The signal lies in the residual directions the
dictionary leaves out, so no read-out over latents can recover it.

So the response gate gets a second trigger: that probe (sample labels only; class-balanced L2 logistic on
each select answer's mean residual, standardised, C by calibration average precision), scored through the
gate's own causal window. Its threshold is set at the response budget on the calibration split's benign
answers, the same rule as the read-out's; the gate cuts where either crosses, so it may flag up to twice the
budget of benign answers (the record says how much it does). It is served as one extra
column of the monitor's encoder (:class:`guard.sae.SelectedEncoder`): one dot product per token. A cut it
makes names no latent; the category read-outs still name the harm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from guard.bundle import MonitorSpec
from guard.monitor import Head, score_sequence
from guard.recipe import calibration as C
from guard.recipe.pipeline import default_work_dir, is_benign_traffic
from guard.recipe.prompt_gate import PartRefit, open_finished_build, refit_each_monitor
from guard.recipe.response_context import answer_kind, cache_rows
from guard.recipe.sources import Sample
from guard.sae import probe_id

log = logging.getLogger(__name__)

PROBE_FIELDS = frozenset({"response_probe", "threads"})


def add_probe_column(encoder: Any, w: np.ndarray) -> tuple[Any, int]:
    """``encoder`` with the residual probe ``w`` (d_in,) as one more column, and that column's id (the first
    probe id no other column holds)."""
    import torch

    ids = list(encoder.probe_ids)
    pid = next(probe_id(j) for j in range(len(ids) + 1) if probe_id(j) not in ids)
    col = torch.as_tensor(np.asarray(w, dtype=np.float32)).reshape(-1, 1)
    W = col if encoder.probe_W is None else torch.cat([encoder.probe_W.to(col.dtype), col], dim=1)
    return encoder.with_probes(W, [*ids, pid]), pid


def without_probe(spec: MonitorSpec, gate: str) -> MonitorSpec:
    """``spec`` without ``gate``'s residual probe and its encoder column; a gate whose score the probe was added
    to gets the read-out's own threshold and calibration scores back."""
    g = spec.gates[gate]
    if g.probe is None:
        return spec
    drop = set(g.probe.ids)
    enc = spec.encoder
    keep = [k for k, i in enumerate(enc.probe_ids) if i not in drop]
    encoder = replace(enc, probe_W=enc.probe_W[:, keep].contiguous() if keep else None, probe_ids=[enc.probe_ids[k] for k in keep])
    new = replace(g, probe=None, probe_threshold=None, probe_weight=None, probe_benign_scores=[])
    if g.probe_weight is not None:
        rec = g.calibration.get("probe", {})
        if "readout_threshold" not in rec:
            raise ValueError(f"the {gate} gate's added probe has no record of the read-out's own calibration")
        new = replace(new, threshold=float(rec["readout_threshold"]),
                      benign_scores=[float(x) for x in rec.get("readout_benign_scores", [])],
                      own_budget_scores={k: [float(x) for x in v]
                                         for k, v in rec.get("readout_own_budget_scores", {}).items()},
                      calibration={k: v for k, v in g.calibration.items() if k != "probe"})
    return MonitorSpec(encoder, {**spec.gates, gate: new}, spec.name, spec.info, spec.reference)


def gate_numbers(peaks: np.ndarray, samples: Sequence[Sample], threshold: float) -> dict[str, Any]:
    """F1 over the answers (drift streams apart), and the share cut of each kind, at ``threshold``."""
    kinds = np.array([answer_kind(s) for s in samples])
    y = np.array([bool(s.label) for s in samples])
    flag = np.asarray(peaks) > threshold
    nd = kinds != "drift"
    p, r, f = C.prf(flag[nd], y[nd])
    return {"f1": f, "precision": p, "recall": r,
            **{f"{k}_cut": float(flag[kinds == k].mean()) for k in ("benign", "refusal", "other_safe", "drift")
               if (kinds == k).any()}}


def fit_residual_probe(spec: MonitorSpec, cache: Any, layer: int, tok: Any, samples: Sequence[Sample],
                       sel_idx: Sequence[int], cal_idx: Sequence[int], budget: float) -> tuple[MonitorSpec, dict[str, Any]]:
    """``spec`` with a residual probe on its response gate, fitted on the cached select answers ``sel_idx`` and
    thresholded at ``budget`` on the calibration answers ``cal_idx`` (positions in ``samples`` and the cache);
    and the record of the fit."""
    from guard.ladder import fit_probe, residual_features

    t0 = time.time()
    spec = without_probe(spec, "response")
    g = spec.gates["response"]
    sel = [samples[i] for i in sel_idx]
    cal = [samples[i] for i in cal_idx]
    y_sel = np.array([s.label for s in sel])
    y_cal = np.array([s.label for s in cal])
    X_sel, _ = residual_features(cache, layer, sel_idx)
    X_cal, spans = residual_features(cache, layer, cal_idx)
    probe = fit_probe(X_sel, y_sel, X_cal, y_cal)
    del X_sel
    bt = np.array([is_benign_traffic(s) for s in cal])
    p_cal = probe.streamed_dense(spans, g.pooling)
    del spans
    thr_p = C.threshold_at_budget(p_cal[bt], budget)
    encoder, pid = add_probe_column(spec.encoder, np.asarray(probe.w, dtype=np.float32))
    head = Head([pid], [1.0], None, float(probe.b), None, "residual_probe",
                {"fit": "class-balanced L2 logistic on the mean residual", "C": probe.C})
    gate = replace(g, probe=head, probe_threshold=float(thr_p))
    new = MonitorSpec(encoder, {"prompt": spec.gates["prompt"], "response": gate}, spec.name, spec.info, spec.reference)
    # the gate's scores with both triggers, as served, over the calibration answers
    before, after = [], []
    plain = spec.scorer("response")
    scorer = new.scorer("response")
    for acts, norms, span, ctx in cache_rows(cache, layer, new, tok, samples, cal_idx):
        after.append(score_sequence(scorer, acts, norms, span, context_span=ctx).score)
        before.append(score_sequence(plain, acts[:, :len(spec.encoder.ids)], norms, span, context_span=ctx).score)
    before_a, after_a = np.array(before), np.array(after)
    rec: dict[str, Any] = {
        "C": probe.C, "probe_threshold": float(thr_p), "budget": budget,
        "probe_average_precision": C.average_precision(p_cal, y_cal),
        "probe_flagged_benign_traffic": float(np.mean(p_cal[bt] > thr_p)) if bt.any() else 0.0,
        "flagged_benign_traffic": float(np.mean(after_a[bt] > g.threshold)) if bt.any() else 0.0,
        "calibration": {"readout_only": gate_numbers(before_a, cal, g.threshold),
                        "with_probe": gate_numbers(after_a, cal, g.threshold)},
        "n_select": len(sel), "n_calib": len(cal), "seconds": time.time() - t0}
    gate = replace(gate, probe_benign_scores=sorted(float(x) for x in p_cal[bt]), calibration={**g.calibration, "probe": rec})
    new = MonitorSpec(encoder, {"prompt": spec.gates["prompt"], "response": gate}, spec.name, spec.info, spec.reference)
    log.info("response residual probe: C %s, threshold %.3f; calibration F1 %.3f -> %.3f, drift cut %.3f -> %.3f, "
             "benign cut %.3f -> %.3f", probe.C, thr_p, rec["calibration"]["readout_only"]["f1"],
             rec["calibration"]["with_probe"]["f1"], rec["calibration"]["readout_only"].get("drift_cut", 0.0),
             rec["calibration"]["with_probe"].get("drift_cut", 0.0), rec["calibration"]["readout_only"]["benign_cut"],
             rec["calibration"]["with_probe"]["benign_cut"])
    return new, rec


def refit_response_probe(out_dir: str | Path, base_model: str | Path | None = None, preset: str = "cpu",
                         work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                         commit_stages: bool = False) -> dict[str, Any]:
    """Fit every monitor's response residual probe in ``out_dir`` (a finished build); returns the provenance.
    Only the select and calibration answers go through each network (resumable, in the residual cache format)."""
    fb = open_finished_build(out_dir, base_model, preset, overrides, PROBE_FIELDS, "response residual probe")
    cfg, layer = fb.cfg, int(fb.manifest["layer"])
    if not cfg.response_probe:
        raise ValueError("response_probe is off: there is no residual probe to fit")
    work = Path(work_dir) if work_dir is not None else default_work_dir(preset)
    work.mkdir(parents=True, exist_ok=True)
    answers, sel_idx, cal_idx = fb.answers()

    def fit(name: str, model: Any, tok: Any, spec: MonitorSpec, progress: Callable[[float], None]
            ) -> tuple[MonitorSpec, dict[str, Any]]:
        cache = fb.monitor_cache(name, model, tok, answers, work / "cache" / f"response-probe-{name}", progress)
        return fit_residual_probe(spec, cache, layer, tok, answers, sel_idx, cal_idx, cfg.budget_response)

    record: dict[str, Any] = {"layer": layer, "answers": {"select": len(sel_idx), "calib": len(cal_idx)}}
    return refit_each_monitor(
        fb, PartRefit("response", "probe", "probe", "guard build: response residual probe fitted"), fit, record,
        lambda prec, seconds: {**prec, "fit_seconds": prec["seconds"], "seconds": seconds}, commit_stages)
