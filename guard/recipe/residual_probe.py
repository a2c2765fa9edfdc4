"""The response gate's residual probe: a second trigger that reads what the SAE does not reconstruct.

The evaluation ladder, split by evaluation group, shows where a stream that turns unsafe after a benign
answer is lost. A dense logistic probe on the served layer's residual, streamed through the gate's window,
cuts most of them; the same probe on the SAE's reconstruction (a linear function of all latents) cuts almost
none, and on the reconstruction's error it cuts most again. The signal lies in the residual directions the
dictionary leaves out, so no read-out over latents can recover it.

So the response gate gets a second trigger: that probe (sample labels only), scored through the gate's own
causal window. A probe fitted on each answer's mean residual is served on its windows, and the two differ
where it matters: an unsafe answer is cut by its worst window, a benign one passes only if every window
passes. So the probe is fitted the way it is served (``window_max``, the read-out's own rule): starting from
the mean-residual probe, each unsafe select answer contributes its highest-scoring window under the current
probe (which window is unsafe is not known; the label says one is), each safe one contributes windows at a
fixed stride plus its highest-scoring ones, every answer weighing the same; two rounds, each refit on the
windows the previous probe picks. An unsafe answer's mean is not added as a positive: a mean is a much
quieter vector than a window, and fitting both pulled the probe off the unsafe window's direction (calibration
recall at the budget 0.69 with the means, 0.81 without). C is chosen by what is served: the probe's recall
of the calibration split's unsafe answers, drift streams included, at half, one and one and a half times the
budget on benign answers (one budget's tail is a few answers). ``mean`` keeps the mean-residual probe with C
by calibration average precision. The probe's threshold is set at the response budget on the calibration
split's benign answers, the same rule as the read-out's; the gate cuts where either crosses, so it may flag up to twice the
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
from guard.monitor import Head, Pooling, score_sequence
from guard.recipe import calibration as C
from guard.recipe.pipeline import RESPONSE_PROBE_FITS as PROBE_FITS
from guard.recipe.pipeline import default_work_dir, is_benign_traffic
from guard.recipe.prompt_gate import PartRefit, open_finished_build, refit_each_monitor
from guard.recipe.response_context import answer_kind, cache_rows
from guard.recipe.sources import Sample
from guard.sae import probe_id

log = logging.getLogger(__name__)

PROBE_FIELDS = frozenset({"response_probe", "response_probe_fit", "response_probe_c", "threads"})
# the window_max fit: windows of a safe answer taken at this stride (its highest-scoring ones besides), how many
# of those highest ones, and how many rounds of picking windows and refitting
WINDOW_STRIDE = 8
HARD_WINDOWS = 4
ROUNDS = 2


def add_probe_column(encoder: Any, w: np.ndarray) -> tuple[Any, int]:
    """``encoder`` with the residual probe ``w`` (d_in,) as one more column, and that column's id (the first
    probe id no other column holds)."""
    enc, ids = add_probe_columns(encoder, np.asarray(w).reshape(-1, 1))
    return enc, ids[0]


def add_probe_columns(encoder: Any, W: np.ndarray) -> tuple[Any, list[int]]:
    """``encoder`` with the columns of ``W`` (d_in, k) as k more residual-probe columns, and their ids (the
    first probe ids no other column holds)."""
    import torch

    ids = list(encoder.probe_ids)
    free = (probe_id(j) for j in range(len(ids) + W.shape[1] + 1) if probe_id(j) not in ids)
    new = [next(free) for _ in range(W.shape[1])]
    cols = torch.as_tensor(np.asarray(W, dtype=np.float32))
    full = cols if encoder.probe_W is None else torch.cat([encoder.probe_W.to(cols.dtype), cols], dim=1)
    return encoder.with_probes(full, [*ids, *new]), new


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
    new = replace(g, probe=None, probe_threshold=None, probe_weight=None, probe_hidden=None, probe_benign_scores=[])
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


def window_means(x: np.ndarray, pooling: Pooling) -> np.ndarray:
    """(T, d) residual rows -> (T, d): row t is the vector whose dot with a probe's weights is the served
    window score c_t less the bias (:func:`guard.monitor.pool` applied to the rows, not to their scores)."""
    cs = np.concatenate([np.zeros((1, x.shape[1])), np.cumsum(x, 0, dtype=np.float64)])
    t = np.arange(len(x))
    n = np.minimum(t + 1, pooling.window)
    return ((cs[t + 1] - cs[t + 1 - n]) / np.maximum(n, pooling.min_count)[:, None]).astype(np.float32)


def served_recall(peaks: np.ndarray, y: np.ndarray, benign: np.ndarray, budget: float) -> float:
    """Mean recall of the positives of ``y`` at the thresholds that flag 0.5, 1 and 1.5 times ``budget`` of the
    ``benign`` samples' ``peaks``."""
    pos = np.asarray(y, dtype=bool)
    return float(np.mean([(peaks[pos] > C.threshold_at_budget(peaks[benign], f * budget)).mean()
                          for f in (0.5, 1.0, 1.5)]))


def fit_window_probe(wins: Sequence[np.ndarray | None], y: np.ndarray, start: Any, pooling: Pooling, c: float,
                     rounds: int = ROUNDS, stride: int = WINDOW_STRIDE, hard: int = HARD_WINDOWS) -> Any:
    """A :class:`guard.ladder.LinearProbe` fitted on served windows (the ``window_max`` fit of the module
    docstring): ``wins`` each answer's :func:`window_means` (None for an answer with no scored token), ``y`` its
    label, ``start`` the probe whose top windows the first round takes, ``c`` the inverse L2 strength."""
    from sklearn.linear_model import LogisticRegression

    from guard.ladder import LinearProbe

    y = np.asarray(y, dtype=int)
    fixed, fixed_of = [], []
    for k, v in enumerate(wins):
        if y[k] == 0 and v is not None:
            ix = np.unique(np.r_[np.arange(min(pooling.min_count, len(v)) - 1, len(v), stride), len(v) - 1])
            fixed.append(v[ix])
            fixed_of.append(np.full(len(ix), k))
    if not fixed or not y.any():
        raise ValueError("a window probe needs safe and unsafe answers with scored tokens")
    neg, neg_of = np.concatenate(fixed), np.concatenate(fixed_of)
    w, b = np.asarray(start.w, dtype=np.float64), float(start.b)
    for _ in range(rounds):
        top: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {lab: ([], []) for lab in (0, 1)}
        for k, v in enumerate(wins):
            if v is None:
                continue
            ix = np.argsort(-(v @ w), kind="stable")[:1 if y[k] else hard]
            top[int(y[k])][0].append(v[ix])
            top[int(y[k])][1].append(np.full(len(ix), k))
        parts, labels, weights = [], [], []
        for X, of, lab in ((np.concatenate(top[1][0]), np.concatenate(top[1][1]), 1), (neg, neg_of, 0),
                           (np.concatenate(top[0][0]), np.concatenate(top[0][1]), 0)):
            parts.append(X)
            labels.append(np.full(len(X), lab))
            weights.append(1.0 / np.bincount(of)[of])     # each answer's windows of one kind weigh 1 in all
        X, lab, sw = np.concatenate(parts), np.concatenate(labels), np.concatenate(weights)
        # the two classes weigh the same in all
        sw = np.where(lab == 1, sw / sw[lab == 1].sum(), sw / sw[lab == 0].sum()) * len(lab) / 2
        mu, sd = X.mean(0), X.std(0)
        sd[sd < 1e-6] = 1.0
        m = LogisticRegression(C=c, max_iter=1000)
        m.fit((X - mu) / sd, lab, sample_weight=sw)
        w = m.coef_[0] / sd
        b = float(m.intercept_[0] - (m.coef_[0] * mu / sd).sum())
    return LinearProbe(w, b, c)


def fit_residual_probe(spec: MonitorSpec, cache: Any, layer: int, tok: Any, samples: Sequence[Sample],
                       sel_idx: Sequence[int], cal_idx: Sequence[int], budget: float, fit: str = "window_max",
                       c_grid: Sequence[float] = ()) -> tuple[MonitorSpec, dict[str, Any]]:
    """``spec`` with a residual probe on its response gate, fitted on the cached select answers ``sel_idx`` and
    thresholded at ``budget`` on the calibration answers ``cal_idx`` (positions in ``samples`` and the cache);
    and the record of the fit. ``fit``: one of :data:`PROBE_FITS`; ``c_grid``: the Cs a ``window_max`` fit tries."""
    from guard.ladder import fit_probe, residual_features

    if fit not in PROBE_FITS:
        raise ValueError(f"unknown response probe fit {fit!r}: one of {PROBE_FITS}")
    if fit == "window_max" and (not c_grid or min(c_grid) <= 0):
        raise ValueError(f"a window_max probe needs Cs > 0 to try, got {list(c_grid)}")

    t0 = time.time()
    spec = without_probe(spec, "response")
    g = spec.gates["response"]
    sel = [samples[i] for i in sel_idx]
    cal = [samples[i] for i in cal_idx]
    y_sel = np.array([s.label for s in sel])
    y_cal = np.array([s.label for s in cal])
    X_sel, sel_spans = residual_features(cache, layer, sel_idx)
    X_cal, spans = residual_features(cache, layer, cal_idx)
    probe = fit_probe(X_sel, y_sel, X_cal, y_cal)
    bt = np.array([is_benign_traffic(s) for s in cal])
    p_cal = probe.streamed_dense(spans, g.pooling)
    tried: list[dict[str, Any]] = [{"fit": "mean", "C": probe.C, "served_recall": served_recall(p_cal, y_cal, bt, budget)}]
    if fit == "window_max":
        # every C refits on the same windows: form them once
        wins = [window_means(x, g.pooling) if len(x) else None for x in sel_spans]
        del sel_spans
        best = None
        for c in sorted(c_grid):
            cand = fit_window_probe(wins, y_sel, probe, g.pooling, float(c))
            p = cand.streamed_dense(spans, g.pooling)
            tried.append({"fit": "window_max", "C": float(c), "served_recall": served_recall(p, y_cal, bt, budget)})
            if best is None or tried[-1]["served_recall"] > best[0]:    # a tie keeps the smaller C
                best = (tried[-1]["served_recall"], cand, p)
        assert best is not None
        _, probe, p_cal = best
    else:
        del sel_spans
    del X_sel, spans
    thr_p = C.threshold_at_budget(p_cal[bt], budget)
    encoder, pid = add_probe_column(spec.encoder, np.asarray(probe.w, dtype=np.float32))
    how = {"mean": "class-balanced L2 logistic on the mean residual",
           "window_max": "class-balanced L2 logistic on served windows, each unsafe answer's highest"}[fit]
    head = Head([pid], [1.0], None, float(probe.b), None, "residual_probe", {"fit": how, "C": probe.C})
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
        "fit": fit, "C": probe.C, "tried": tried, "probe_threshold": float(thr_p), "budget": budget,
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
        return fit_residual_probe(spec, cache, layer, tok, answers, sel_idx, cal_idx, cfg.budget_response,
                                  cfg.response_probe_fit, cfg.response_probe_c)

    record: dict[str, Any] = {"layer": layer, "answers": {"select": len(sel_idx), "calib": len(cal_idx)}}
    return refit_each_monitor(
        fb, PartRefit("response", "probe", "probe", "guard build: response residual probe fitted"), fit, record,
        lambda prec, seconds: {**prec, "fit_seconds": prec["seconds"], "seconds": seconds}, commit_stages)
