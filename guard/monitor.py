"""Pure per-token scoring and the cut decision (NExT-Guard Stage 2). No model, no I/O, no clock.

Per token t: a causal norm filter zeroes the SAE activations of outlier tokens, the token score is
c_t = sum_j s_j a_{t,j} over the gate's selected latents, an aggregation mode turns c into a series
g such that the stream is cut at the first valid token with g_t > gamma (one rule, strict ``>``,
used by calibration and serving alike):

* ``max``      g_t = c_t (the reference code: first crossing == running max exceeds gamma)
* ``debounce`` g_t = min(c_{t-1}, c_t): two consecutive tokens above gamma (Qwen3Guard-Stream's rule)
* ``decay``    g_t = sum_{i<w} d^i c_{t-i}, w = 10, d = 0.5 (the reference code's unused accumulator)

The sample-level score used for calibration is max_t g_t over valid tokens, so "score > gamma" is
exactly "the stream would have been cut".

The same code runs offline on a whole sequence (:func:`score_sequence`) and online token by token
(:class:`StreamScorer`); a test checks they agree token for token.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from guard.features import GateFeatures

MODES = ("max", "debounce", "decay")
NEG = float("-inf")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        import difflib

        close = difflib.get_close_matches(mode, MODES, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"Unknown aggregation mode '{mode}'.{hint} Available: {', '.join(MODES)}")
    return mode


class CausalNormFilter:
    """Zero tokens whose residual norm exceeds ``ratio`` x the running median of the norms seen so far.

    The reference code uses the median over the whole sequence (future tokens included), which a
    stream cannot know; here the median is over positions 0..t. Position 0 (the attention sink) is
    always dropped, as in the reference code.
    """

    def __init__(self, ratio: float = 10.0) -> None:
        self.ratio = ratio
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._sorted)

    def _median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    def step(self, norm: float) -> bool:
        """Feed the next token's norm; True if the token is kept."""
        pos = len(self._sorted)
        bisect.insort(self._sorted, float(norm))
        if pos == 0:
            return False
        return bool(norm <= self.ratio * self._median())

    def mask(self, norms: Sequence[float] | np.ndarray) -> np.ndarray:
        return np.array([self.step(float(x)) for x in norms], dtype=bool)


def causal_norm_mask(norms: Sequence[float] | np.ndarray, ratio: float = 10.0) -> np.ndarray:
    return CausalNormFilter(ratio).mask(norms)


def aggregate(c: np.ndarray, mode: str, window: int = 10, decay: float = 0.5) -> np.ndarray:
    """Turn token scores c (valid tokens only, in order) into the series g compared with gamma."""
    check_mode(mode)
    c = np.asarray(c, dtype=np.float64)
    if mode == "max":
        return c.copy()
    if mode == "debounce":
        g = np.full_like(c, NEG)
        if len(c) > 1:
            g[1:] = np.minimum(c[:-1], c[1:])
        return g
    g = np.zeros_like(c)
    for i in range(min(window, len(c))):
        g[i:] += (decay ** i) * c[: len(c) - i]
    return g


def first_cut(g: np.ndarray, threshold: float) -> int | None:
    idx = np.flatnonzero(np.asarray(g) > threshold)
    return int(idx[0]) if idx.size else None


def sample_score(g: np.ndarray) -> float:
    """max_t g_t; 0 when there is nothing to score (empty span, or one token under debounce)."""
    if len(g) == 0:
        return 0.0
    m = float(np.max(g))
    return m if np.isfinite(m) else 0.0


@dataclass
class GateScorer:
    """Token scores of one gate from activations of the union of its latents.

    ``columns`` are the latent ids in the order of the activation matrix the caller provides
    (the :class:`~guard.sae.SelectedEncoder` ids); each feature set indexes into them.
    """

    features: GateFeatures
    columns: list[int]
    threshold: float
    category_thresholds: dict[str, float] = field(default_factory=dict)
    mode: str = "max"

    def __post_init__(self) -> None:
        check_mode(self.mode)
        pos = {c: i for i, c in enumerate(self.columns)}
        missing = [j for j in self.features.all_ids() if j not in pos]
        if missing:
            raise ValueError(f"activation columns lack selected latents {missing[:8]}")
        self._ov_idx = np.array([pos[j] for j in self.features.overall.ids], dtype=np.int64)
        self._ov_w = np.array(self.features.overall.weights, dtype=np.float64)
        self._cat = {
            c: (np.array([pos[j] for j in fs.ids], dtype=np.int64), np.array(fs.weights, dtype=np.float64))
            for c, fs in self.features.categories.items()
        }

    @property
    def categories(self) -> list[str]:
        return list(self._cat)

    def token_scores(self, acts: np.ndarray) -> np.ndarray:
        """(T, n_columns) -> (T,) c_t of the overall feature set."""
        return np.asarray(acts, dtype=np.float64)[:, self._ov_idx] @ self._ov_w

    def category_token_scores(self, acts: np.ndarray) -> dict[str, np.ndarray]:
        a = np.asarray(acts, dtype=np.float64)
        return {c: a[:, idx] @ w for c, (idx, w) in self._cat.items()}

    def category_at(self, acts_row: np.ndarray) -> str:
        """The category whose score, relative to its own calibrated threshold, is highest at a token."""
        best, best_r = "unsafe", NEG
        for c, (idx, w) in self._cat.items():
            thr = self.category_thresholds.get(c)
            if thr is None or thr <= 0:
                continue
            r = float(np.asarray(acts_row, dtype=np.float64)[idx] @ w) / thr
            if r > best_r:
                best, best_r = c, r
        return best

    def top_features(self, acts_row: np.ndarray, n: int = 5) -> list[tuple[int, float]]:
        """Latents of the overall set with the largest contribution s_j a_j at a token."""
        a = np.asarray(acts_row, dtype=np.float64)[self._ov_idx]
        contrib = a * self._ov_w
        order = np.argsort(-contrib, kind="stable")[:n]
        return [(int(self.features.overall.ids[i]), float(a[i])) for i in order if a[i] > 0]


@dataclass
class SequenceScore:
    c: np.ndarray                 # token scores over the valid span (filtered tokens score 0)
    g: np.ndarray                 # aggregated series
    score: float                  # max g
    cut: int | None               # index into the valid span of the first g > threshold
    kept: np.ndarray              # norm-filter mask over the valid span


def score_sequence(
    scorer: GateScorer, acts: np.ndarray, norms: np.ndarray, span: tuple[int, int],
    threshold: float | None = None, mode: str | None = None, norm_ratio: float = 10.0,
) -> SequenceScore:
    """Offline scoring of one formatted sample. ``acts``/``norms`` cover all tokens (context included)
    because the causal norm filter's median runs over every position from 0."""
    kept_all = causal_norm_mask(norms, norm_ratio)
    s, e = span
    a = np.asarray(acts, dtype=np.float64)[s:e] * kept_all[s:e, None]
    c = scorer.token_scores(a)
    g = aggregate(c, mode or scorer.mode)
    thr = scorer.threshold if threshold is None else threshold
    return SequenceScore(c=c, g=g, score=sample_score(g), cut=first_cut(g, thr), kept=kept_all[s:e])


class StreamScorer:
    """Online version of :func:`score_sequence` for one stream: feed context tokens, then valid tokens."""

    def __init__(self, scorer: GateScorer, threshold: float | None = None, mode: str | None = None,
                 norm_ratio: float = 10.0, window: int = 10, decay: float = 0.5) -> None:
        self.scorer = scorer
        self.threshold = scorer.threshold if threshold is None else float(threshold)
        self.mode = check_mode(mode or scorer.mode)
        self.norms = CausalNormFilter(norm_ratio)
        self.window, self.decay = window, decay
        self._hist: deque[float] = deque(maxlen=window)
        self.n_valid = 0
        self.max_g = NEG
        self.last: dict[str, Any] = {}

    def context(self, norms: Sequence[float]) -> None:
        """Tokens that are not scored (the formatted prompt prefix) still feed the running median."""
        for x in norms:
            self.norms.step(float(x))

    def step(self, acts_row: np.ndarray, norm: float) -> tuple[float, float, bool]:
        """Score one valid token: returns (c_t, g_t, cut_now)."""
        kept = self.norms.step(float(norm))
        row = np.asarray(acts_row, dtype=np.float64) * (1.0 if kept else 0.0)
        c = float(self.scorer.token_scores(row[None, :])[0])
        if self.mode == "max":
            g = c
        elif self.mode == "debounce":
            g = min(self._hist[-1], c) if self._hist else NEG
        else:
            g = c + sum((self.decay ** (i + 1)) * v for i, v in enumerate(reversed(self._hist)))
            # the window holds w-1 previous scores, so g sums exactly w terms
        self._hist.append(c)
        if self.mode == "decay" and len(self._hist) > self.window - 1:
            self._hist.popleft()
        self.n_valid += 1
        self.max_g = max(self.max_g, g)
        self.last = {"row": row, "c": c, "g": g}
        return c, g, bool(g > self.threshold)
