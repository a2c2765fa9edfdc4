"""The prompt gate's residual probe: a dense read of the request, added to the latent read-out's score.

On direct harmful requests written apart from the build, the sparse read-out refuses about two thirds at its
budget, while a dense logistic probe on the served layer's mean residual refuses most of them but also more of
the sensitive-sounding benign requests. The two err on different requests, so the gate scores their sum: the
read-out's score plus the probe's logit weighted by the ratio of their spreads over the calibration split's
benign traffic (so that neither dominates by scale alone), with one threshold set at the prompt budget by the
rule the read-out's threshold follows (:func:`guard.recipe.pipeline.budget_threshold`: benign traffic, and each
generated benign kind on its own). The response gate's probe is a second trigger instead (the larger of the
two scores): a stream's drift shows in one of them, not in both.

The probe is fitted as the read-out is, on the select split's prompts and the generated ones (sample labels
only, on each request's mean residual over the scored tokens, filtered tokens counting as zero, standardised):
a class-balanced L2 logistic regression (C by calibration average precision), served as one more
residual-probe column of the monitor's encoder, so the gate's pooled score is exactly the read-out's plus the
weighted probe's; or, with ``prompt_probe_hidden``, one hidden layer of ReLU units (:func:`guard.ladder.
fit_hidden_probe`). A unit's pre-activation is linear in the residual, so each unit is one more column, the gate
pools the columns as it pools the read-out, and the units' ReLU and output weights are applied to the pooled
values (:class:`guard.monitor.HiddenLayer`): the score is the probe on the request's mean residual, as fitted.
Unlike the logistic regression, the hidden layer can weigh one direction of the residual by what another says
(guard/README.md reports what it gains on requests written apart from the build). A refusal still names the
read-out's latents.
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
from guard.monitor import Head, HiddenLayer, causal_norm_mask, score_sequence
from guard.recipe import calibration as C
from guard.recipe.pipeline import budget_threshold, generated_prompt_samples, is_benign_traffic
from guard.recipe.prompt_gate import PartRefit, open_finished_build, refit_each_monitor
from guard.recipe.residual_probe import add_probe_column, add_probe_columns, without_probe
from guard.recipe.sources import Sample

log = logging.getLogger(__name__)

PROMPT_PROBE_FIELDS = frozenset({"prompt_probe", "prompt_probe_hidden", "prompt_probe_linear", "threads"})

# (residual after the layer (T, d), scored span) of each sample's conversation, as the guard reads it
Rows = Callable[[Sequence[Sample]], list[tuple[Any, tuple[int, int]]]]


def model_rows(model: Any, tok: Any, layer: int, max_tokens: int = 2048) -> Rows:
    """Rows from one forward of ``model`` per sample (prompts are short: no cache is kept)."""
    from guard.evaluate import residual_rows

    def rows(samples: Sequence[Sample]) -> list[tuple[Any, tuple[int, int]]]:
        return [(r[0], r[1]) for r in residual_rows(model, tok, layer, samples, max_tokens=max_tokens)]

    return rows


def _features(spec: MonitorSpec, rows: list[tuple[Any, tuple[int, int]]], norm_ratio: float = 10.0
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: the probe's input (the mean residual over the scored span, filtered tokens as zero, as the
    gate pools them) and the read-out's score as served."""
    readout = spec.scorer("prompt")
    d = int(rows[0][0].shape[1]) if rows else 0
    X = np.zeros((len(rows), d), dtype=np.float32)
    ro = np.zeros(len(rows))
    for i, (resid, (s, e)) in enumerate(rows):
        norms = resid.norm(dim=-1).numpy()
        acts = spec.encoder.encode(resid).numpy()
        ro[i] = score_sequence(readout, acts, norms, (s, e), norm_ratio=norm_ratio).score
        X[i] = scored_mean(resid, (s, e), norm_ratio)
    return X, ro


def scored_mean(resid: Any, span: tuple[int, int], norm_ratio: float = 10.0) -> np.ndarray:
    """The probe's input for one request: its mean residual over the scored span, tokens the causal norm filter
    drops counting as zero, as the gate pools them (zeros for an empty span)."""
    s, e = span
    if e <= s:
        return np.zeros(int(resid.shape[1]), dtype=np.float32)
    kept = causal_norm_mask(resid.norm(dim=-1).numpy(), norm_ratio)[s:e]
    return (resid.numpy()[s:e] * kept[:, None]).mean(0)


def fit_prompt_probe(spec: MonitorSpec, rows: Rows, sel: Sequence[Sample], cal: Sequence[Sample], budget: float,
                     hidden: int = 0, linear: bool = False) -> tuple[MonitorSpec, dict[str, Any]]:
    """``spec`` with a residual probe added to its prompt gate's score, fitted on ``sel`` and calibrated at
    ``budget`` on ``cal`` (prompt samples, generated ones included); and the record of the fit. ``hidden``: the
    units of the probe's hidden layer per seed (0: a logistic regression); ``linear``: with a hidden layer, a
    logistic line beside it (one more column)."""
    from guard.ladder import HiddenProbe, added_weight, fit_hidden_probe, fit_probe

    t0 = time.time()
    if any(s.gate != "prompt" for s in [*sel, *cal]):
        raise ValueError("the prompt probe is fitted on prompt samples only")
    spec = without_probe(spec, "prompt")
    g = spec.gates["prompt"]
    if not g.pooling.final:
        raise ValueError("an added probe needs a gate that scores the whole request at its last token")
    X_sel, _ = _features(spec, rows(sel))
    X_cal, ro_cal = _features(spec, rows(cal))
    y_sel = np.array([s.label for s in sel])
    y_cal = np.array([s.label for s in cal])
    if linear and not hidden:
        raise ValueError("a line beside the prompt probe's hidden layer needs a hidden layer (prompt_probe_hidden)")
    probe = (fit_hidden_probe(X_sel, y_sel, X_cal, y_cal, hidden, linear=linear) if hidden
             else fit_probe(X_sel, y_sel, X_cal, y_cal))
    del X_sel
    pr_cal = probe.pooled(X_cal)
    bt_all = np.array([is_benign_traffic(s) for s in cal], dtype=bool)
    if bt_all.sum() < 2:
        raise ValueError("calibrating the prompt probe needs benign traffic in the calibration prompts")
    weight = added_weight(ro_cal[bt_all], pr_cal[bt_all])
    combined = ro_cal + weight * pr_cal
    thr, bt, _, own = budget_threshold(combined, list(cal), budget)
    units: HiddenLayer | None = None
    if isinstance(probe, HiddenProbe):
        # one encoder column per hidden unit: its pre-activation is linear in the residual, so the gate pools it;
        # the line beside the layer is one more column, read as it pools
        W = probe.W1 if probe.lin is None else np.hstack([probe.W1, probe.lin[:, None]])
        encoder, pids = add_probe_columns(spec.encoder, W)
        head = Head(pids, [1.0] * len(pids), None, float(probe.b2), None, "residual_probe", probe.info)
        units = HiddenLayer([float(x) for x in probe.b1], [float(x) for x in probe.w2],
                            [] if probe.lin is None else [1.0])
        fit_rec: dict[str, Any] = {"hidden": probe.info}
    else:
        encoder, pid = add_probe_column(spec.encoder, np.asarray(probe.w, dtype=np.float32))
        head = Head([pid], [1.0], None, float(probe.b), None, "residual_probe",
                    {"fit": "class-balanced L2 logistic on the mean residual", "C": probe.C})
        fit_rec = {"C": probe.C}

    def numbers(score: np.ndarray, t: float, own: dict[str, list[float]]) -> dict[str, Any]:
        f = score > t
        p, r, f1 = C.prf(f, y_cal.astype(bool))
        out = {"f1": f1, "precision": p, "recall": r,
               "balanced_accuracy": 0.5 * (float(f[y_cal == 1].mean()) + 1.0 - float(f[y_cal == 0].mean())),
               "average_precision": C.average_precision(score, y_cal),
               "flagged_benign_traffic": float(f[bt].mean()) if bt.any() else 0.0}
        for src, scores in own.items():
            out[f"{src.rsplit('/', 1)[-1]}_flagged"] = float(np.mean(np.asarray(scores) > t)) if scores else 0.0
        return out

    rec: dict[str, Any] = {
        **fit_rec, "weight": weight, "threshold": float(thr), "budget": budget,
        # the read-out's own calibration, which taking the probe out again restores (:func:`without_probe`)
        "readout_threshold": g.threshold, "readout_benign_scores": list(g.benign_scores),
        "readout_own_budget_scores": dict(g.own_budget_scores),
        "probe_average_precision": C.average_precision(pr_cal, y_cal),
        # the read-out's generated kinds against the scores its threshold was set on: recomputed here they can
        # differ in the last bits, and a request tied with the threshold would then count on the other side
        "calibration": {"readout_only": numbers(ro_cal, g.threshold, dict(g.own_budget_scores)),
                        "with_probe": numbers(combined, thr, own)},
        "n_select": len(sel), "n_calib": len(cal), "seconds": time.time() - t0}
    gate = replace(g, threshold=float(thr), probe=head, probe_threshold=None, probe_weight=weight, probe_hidden=units,
                   benign_scores=sorted(float(x) for x in combined[bt]), own_budget_scores=own,
                   calibration={**g.calibration, "probe": rec})
    new = MonitorSpec(encoder, {"prompt": gate, "response": spec.gates["response"]}, spec.name, spec.info,
                      spec.reference)
    log.info("prompt residual probe: %s, weight %.3f, threshold %.3f -> %.3f; calibration balanced accuracy "
             "%.3f -> %.3f, benign traffic flagged %.3f -> %.3f", fit_rec, weight, g.threshold, thr,
             rec["calibration"]["readout_only"]["balanced_accuracy"], rec["calibration"]["with_probe"]["balanced_accuracy"],
             rec["calibration"]["readout_only"]["flagged_benign_traffic"],
             rec["calibration"]["with_probe"]["flagged_benign_traffic"])
    return new, rec


def prompt_samples(splits: dict[str, list[Sample]], cfg: Any) -> tuple[list[Sample], list[Sample]]:
    """The prompt read-out's fitting and calibration samples: the dataset's prompts and the generated ones."""
    gen = generated_prompt_samples(cfg)
    sel = [s for s in splits["select"] if s.gate == "prompt"] + [s for k in gen.values() for s in k["select"]]
    cal = [s for s in splits["calib"] if s.gate == "prompt"] + [s for k in gen.values() for s in k["calib"]]
    return sel, cal


def refit_prompt_probe(out_dir: str | Path, base_model: str | Path | None = None, preset: str = "cpu",
                       work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                       commit_stages: bool = False) -> dict[str, Any]:
    """Fit every monitor's prompt residual probe in ``out_dir`` (a finished build); returns the provenance.
    Only the prompts go through each network, a few minutes on two cores, so no cache is kept (``work_dir`` is
    accepted like the other refits')."""
    fb = open_finished_build(out_dir, base_model, preset, overrides, PROMPT_PROBE_FIELDS, "prompt residual probe")
    cfg, layer = fb.cfg, int(fb.manifest["layer"])
    if not cfg.prompt_probe:
        raise ValueError("prompt_probe is off: there is no prompt residual probe to fit")
    sel, cal = prompt_samples(fb.dataset.splits, cfg)

    def fit(name: str, model: Any, tok: Any, spec: MonitorSpec, progress: Callable[[float], None]
            ) -> tuple[MonitorSpec, dict[str, Any]]:
        return fit_prompt_probe(spec, model_rows(model, tok, layer, cfg.max_tokens), sel, cal, cfg.budget_prompt,
                                cfg.prompt_probe_hidden, cfg.prompt_probe_linear)

    record: dict[str, Any] = {"layer": layer, "prompts": {"select": len(sel), "calib": len(cal)}}
    return refit_each_monitor(
        fb, PartRefit("prompt", "probe", "prompt_probe", "guard build: prompt residual probe fitted", 3.0), fit,
        record, lambda prec, seconds: {**prec, "fit_seconds": prec["seconds"], "seconds": seconds}, commit_stages)
