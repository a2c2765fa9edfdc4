"""Best-F1 threshold on a calibration split, one per gate (prompt, response), with the serving rule.

The rule is ``flag iff score > gamma`` everywhere (the reference code calibrates with sklearn's
``>=`` but evaluates with ``>``). Candidate thresholds are midpoints between consecutive distinct
sample scores (and just below the smallest), so the chosen gamma is not sitting on a sample score.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
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


@dataclass
class Thresholds:
    """Calibrated thresholds of both gates (and per category) plus the aggregation mode they assume."""

    prompt: float
    response: float
    mode: str = "max"
    prompt_categories: dict[str, float] = field(default_factory=dict)
    response_categories: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> Thresholds:
        d = json.loads(Path(path).read_text())
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)
