"""Thresholds from scores on the calibration split, with the serving rule: under a false-positive budget on
benign traffic (the default: at most 2 % of benign prompts refused, 2 % of full-length benign streams cut),
or at best F1 (for per-category read-outs, which only name a cut).

The rule is ``flag iff score > gamma`` everywhere (the reference code calibrates with sklearn's
``>=`` but evaluates with ``>``). Candidate thresholds are midpoints between consecutive distinct
sample scores (and just below the smallest), so the chosen gamma is not sitting on a sample score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Calibration:
    threshold: float
    f1: float
    precision: float
    recall: float
    n: int
    n_pos: int


def prf(pred: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    pred, y = np.asarray(pred, bool), np.asarray(y, bool)
    tp = int((pred & y).sum())
    fp = int((pred & ~y).sum())
    fn = int((~pred & y).sum())
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def _scores_labels(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    if s.shape != y.shape or s.ndim != 1 or len(s) == 0:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must be equal non-empty 1-D arrays")
    return s, y


def _candidates(s: np.ndarray, above: bool = False) -> np.ndarray:
    """Ascending: just below the smallest score, the midpoints, and (``above``) just above the largest."""
    u = np.unique(s)
    below = [u[0] - max(1e-6, 1e-6 * abs(u[0]))]
    top = [u[-1] + max(1e-6, 1e-6 * abs(u[-1]))] if above else []
    return np.concatenate([below, (u[:-1] + u[1:]) / 2.0, top])


def best_f1_threshold(scores: np.ndarray, labels: np.ndarray) -> Calibration:
    s, y = _scores_labels(scores, labels)
    if not y.any():
        raise ValueError("calibration needs at least one unsafe sample")
    cands = _candidates(s)
    # Sort once and sweep: for gamma between u[k-1] and u[k], the flagged set is every score >= u[k].
    order = np.argsort(-s, kind="stable")
    ys = y[order]
    ss = s[order]
    tp_cum = np.cumsum(ys)
    n_pos = int(y.sum())
    best = None
    for g in cands:
        n_flag = int(np.searchsorted(-ss, -g, side="left"))   # number of scores > g
        tp = int(tp_cum[n_flag - 1]) if n_flag else 0
        p = tp / n_flag if n_flag else 0.0
        r = tp / n_pos
        f = 2 * p * r / (p + r) if p + r else 0.0
        if best is None or f > best[1] + 1e-12:
            best = (float(g), f, p, r)
    assert best is not None
    return Calibration(threshold=best[0], f1=best[1], precision=best[2], recall=best[3], n=len(s), n_pos=n_pos)


def threshold_at_fpr(scores: np.ndarray, labels: np.ndarray, max_fpr: float) -> Calibration:
    """The lowest threshold (most recall) whose false-positive rate on the safe samples is <= ``max_fpr``,
    same rule and candidates as :func:`best_f1_threshold`. An operating point for operators who need few
    false cuts more than best F1; ``Calibration.f1`` etc. are its metrics on the same scores."""
    s, y = _scores_labels(scores, labels)
    if not 0.0 <= max_fpr <= 1.0:
        raise ValueError(f"max_fpr must be in [0, 1], got {max_fpr}")
    if y.all() or not y.any():
        raise ValueError("an operating point needs both safe and unsafe samples")
    neg = s[~y]
    for g in _candidates(s, above=True):    # ascending: the first admissible one flags the most
        if float(np.mean(neg > g)) <= max_fpr + 1e-12:
            p, r, f = prf(s > g, y)
            return Calibration(threshold=float(g), f1=f, precision=p, recall=r, n=len(s), n_pos=int(y.sum()))
    raise AssertionError("unreachable: the last candidate flags nothing")


def threshold_at_budget(benign_scores: np.ndarray, budget: float,
                        own_budget_scores: dict[str, list[float]] | None = None) -> float:
    """The lowest threshold at which at most ``budget`` of the benign samples score above it (rule ``> t``):
    the most recall a false-positive budget buys. Midpoint between neighbouring scores (the same rule as
    :meth:`guard.bundle.GateSpec.threshold_for_budget`, which serving uses for an operator's budget)."""
    from guard.bundle import GateSpec
    from guard.monitor import Head, Pooling

    if not len(benign_scores):
        raise ValueError("a budget threshold needs benign samples")
    if not 0.0 <= budget < 1.0:
        raise ValueError(f"budget must be in [0, 1), got {budget}")
    return GateSpec(Head([], []), Pooling(), 0.0, benign_scores=[float(x) for x in benign_scores],
                    own_budget_scores=own_budget_scores or {}).threshold_for_budget(budget)


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    s, y = _scores_labels(scores, labels)
    order = np.argsort(-s, kind="stable")
    ys = y[order]
    tp = np.cumsum(ys)
    prec = tp / np.arange(1, len(ys) + 1)
    return float((prec * ys).sum() / max(ys.sum(), 1))


def operating_point(scores: np.ndarray, labels: np.ndarray, threshold: float,
                    benign_traffic: np.ndarray | None = None) -> dict[str, Any]:
    """What a threshold gives on a labelled set: recall, flagged share of safe samples (and of benign
    traffic when a mask is given), precision, F1, balanced accuracy."""
    s, y = _scores_labels(scores, labels)
    pred = s > threshold
    p, r, f = prf(pred, y)
    fpr = float(pred[~y].mean()) if (~y).any() else 0.0
    out = {"threshold": float(threshold), "recall": r, "precision": p, "f1": f, "flagged_safe": fpr,
           "balanced_accuracy": 0.5 * (r + 1.0 - fpr), "n": int(len(s)), "n_unsafe": int(y.sum())}
    if benign_traffic is not None:
        bt = np.asarray(benign_traffic, dtype=bool)
        out["flagged_benign_traffic"] = float(pred[bt].mean()) if bt.any() else 0.0
        out["n_benign_traffic"] = int(bt.sum())
    return out
