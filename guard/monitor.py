"""Pure per-token scoring and the cut decision. No model, no I/O, no clock.

Per valid token t of a gate (prompt tokens, or response tokens with the conversation as context):

1. a causal norm filter zeroes the SAE activations of outlier tokens (running median over positions 0..t;
   position 0, the attention sink, is always dropped);
2. each selected latent's activation is put on a common scale and clipped, f_tj = min(a_tj / s_j, clip);
3. the token's contribution is u_t = sum_j w_j f_tj over the gate's latents (a sparse read-out whose latents
   and weights were chosen from sample-level labels only);
4. the score is a causal window mean plus a bias, c_t = b + sum_{i in last W tokens} u_i / max(min(n_t, W), M),
   with n_t the number of valid tokens so far: one token cannot trip the gate on its own unless it carries
   the whole window's evidence, and a long answer does not push the score up by being long;
5. the stream is cut at the first valid token with c_t > gamma (strict ``>``, the same rule in calibration).

A response gate may add a **context term**. With P the mean of a read-out's contributions over the kept tokens of
the conversation the response answers, as the prompt gate reads it (without the first role label and the
response label: on a short request they would be a large part of the mean),
c'_t = b + e^(k·P) (c_t − b) + a·P: the riskier the request, the less evidence from the answer itself a cut
needs. An answer is unsafe or not by what it answers: the served model's compliance with a harmful request
reads much like its other answers, so a response read-out alone cannot tell them apart; scaled by the
conversation's own risk it can, and a refusal (whose read-out evidence is negative) stays low.

The paper's reference scorer is the special case W = M = 1, s = 1, clip = inf, b = 0, w = the standardised
mean differences: c_t = sum_j s_j a_tj and the cut is the first crossing of the running max.

The same code runs offline on a whole sequence (:func:`score_sequence`) and online token by token
(:class:`StreamScorer`); a test checks they agree token for token.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NEG = float("-inf")


class CausalNormFilter:
    """Zero tokens whose residual norm exceeds ``ratio`` x the running median of the norms seen so far."""

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


@dataclass
class Head:
    """A sparse linear read-out over SAE latents (one gate, one category; ``"all"`` = any harm)."""

    ids: list[int]
    weights: list[float]
    scales: list[float] | None = None       # None = 1 for every latent
    bias: float = 0.0
    clip: float | None = None                # None = no clipping
    category: str = "all"
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.weights) or (self.scales is not None and len(self.scales) != len(self.ids)):
            raise ValueError(f"head '{self.category}': ids, weights and scales must have the same length")
        if self.scales is not None and min(self.scales, default=1.0) <= 0:
            raise ValueError(f"head '{self.category}': scales must be positive")

    def to_dict(self) -> dict[str, Any]:
        return {"ids": self.ids, "weights": self.weights, "scales": self.scales, "bias": self.bias, "clip": self.clip,
                "category": self.category, "info": self.info}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Head:
        return cls(ids=[int(i) for i in d["ids"]], weights=[float(w) for w in d["weights"]],
                   scales=None if d.get("scales") is None else [float(s) for s in d["scales"]],
                   bias=float(d.get("bias", 0.0)), clip=d.get("clip"), category=d.get("category", "all"),
                   info=d.get("info", {}))


@dataclass(frozen=True, slots=True)
class Pooling:
    window: int = 1          # W: tokens averaged
    min_count: int = 1       # M: the first tokens are divided by at least M (damped), 1 <= M <= W
    # Only the last token's c_t decides: the gate scores a whole sequence once (with W covering it, the mean
    # of its tokens' contributions). For the prompt gate, which has the whole request before anything is
    # generated: a dangerous-sounding word early in a harmless request cannot trip it alone. A gate that
    # streams (the response gate) cannot know its last token and never uses it.
    final: bool = False

    def __post_init__(self) -> None:
        if self.window < 1 or not 1 <= self.min_count <= self.window:
            raise ValueError(f"pooling needs window >= 1 and 1 <= min_count <= window, got {self.window}/{self.min_count}")


def peak(c: np.ndarray, p: Pooling) -> float:
    """The score that decides for a series of pooled scores: the last one for a final pooling, else the max."""
    if not len(c):
        return 0.0
    return float(c[-1]) if p.final else float(np.max(c))


def first_crossing(c: np.ndarray, threshold: float, p: Pooling) -> int | None:
    """Index of the token that trips the gate: the first c_t > threshold (only the last for a final pooling)."""
    if p.final:
        return len(c) - 1 if len(c) and c[-1] > threshold else None
    idx = np.flatnonzero(c > threshold)
    return int(idx[0]) if idx.size else None


def pool(u: np.ndarray, p: Pooling, bias: float = 0.0) -> np.ndarray:
    """c_t = b + sum of the last min(t+1, W) values / max(min(t+1, W), M), for a series of valid tokens
    ((T,), or (T, k): each column pooled on its own)."""
    u = np.asarray(u, dtype=np.float64)
    cs = np.concatenate([np.zeros((1, *u.shape[1:])), np.cumsum(u, axis=0)])
    t = np.arange(len(u))
    n = np.minimum(t + 1, p.window)
    s = cs[t + 1] - cs[t + 1 - n]
    d = np.maximum(n, p.min_count)
    return bias + s / (d if u.ndim == 1 else d[:, None])


class _Readout:
    def __init__(self, head: Head, pos: dict[int, int]) -> None:
        self.head = head
        self.idx = np.array([pos[j] for j in head.ids], dtype=np.int64)
        self.w = np.array(head.weights, dtype=np.float64)
        self.inv = None if head.scales is None else 1.0 / np.array(head.scales, dtype=np.float64)
        self.clip = math.inf if head.clip is None else float(head.clip)

    def features(self, acts: np.ndarray) -> np.ndarray:
        f = np.asarray(acts, dtype=np.float64)[..., self.idx]
        if self.inv is not None:
            f = f * self.inv
        return np.minimum(f, self.clip)

    def contrib(self, acts: np.ndarray) -> np.ndarray:
        return self.features(acts) @ self.w


@dataclass(frozen=True)
class ContextTerm:
    """How a response gate's scores depend on the context: with P = the mean contribution of ``head`` over the
    kept context tokens, every c_t becomes b + e^(scale·P) (c_t − b) + weight·P."""

    head: Head
    weight: float = 0.0
    scale: float = 0.0

    # e^(scale·P) is kept within e^±MAX_EXP, so a context far outside what the term was fitted on cannot
    # make the answer's evidence vanish or explode
    MAX_EXP = 5.0

    def apply(self, total: float, n: int) -> tuple[float, float]:
        """(offset, multiplier) for a context whose kept tokens contributed ``total`` over ``n`` tokens."""
        if not n:
            return 0.0, 1.0
        p = total / n
        return self.weight * p, math.exp(max(-self.MAX_EXP, min(self.MAX_EXP, self.scale * p)))

    def to_dict(self) -> dict[str, Any]:
        return {"head": self.head.to_dict(), "weight": self.weight, "scale": self.scale}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ContextTerm:
        return cls(Head.from_dict(d["head"]), float(d.get("weight", 0.0)), float(d.get("scale", 0.0)))


@dataclass(frozen=True)
class HiddenLayer:
    """A probe with one hidden layer of ReLU units, for a gate whose probe is added to its score: the probe head's
    columns hold each unit's pre-activation without its bias, which is linear in the residual, so pooling the
    columns pools the residual the way the gate pools it; the units' biases, the ReLU and the output weights are
    applied after pooling (the output bias is the probe head's). ``linear``: output weights of further columns
    after the units, read as they pool, without bias or ReLU (a line beside the hidden layer)."""

    bias: list[float]
    weights: list[float]
    linear: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.bias) != len(self.weights) or not self.weights:
            raise ValueError(f"a hidden layer needs one bias and one output weight per unit, got {len(self.bias)} "
                             f"biases and {len(self.weights)} weights")

    @property
    def n_columns(self) -> int:
        return len(self.weights) + len(self.linear)

    def apply(self, pooled: np.ndarray) -> np.ndarray:
        """(T, units + linear columns) pooled values -> (T,) the probe's score before its output bias."""
        b, w = np.asarray(self.bias, dtype=np.float64), np.asarray(self.weights, dtype=np.float64)
        p = np.atleast_2d(pooled)
        n = len(w)
        out = np.maximum(p[:, :n] + b, 0.0) @ w
        return out + p[:, n:] @ np.asarray(self.linear, dtype=np.float64) if self.linear else out

    def to_dict(self) -> dict[str, Any]:
        return {"bias": [float(x) for x in self.bias], "weights": [float(x) for x in self.weights],
                **({"linear": [float(x) for x in self.linear]} if self.linear else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HiddenLayer:
        return cls([float(x) for x in d["bias"]], [float(x) for x in d["weights"]],
                   [float(x) for x in d.get("linear", [])])


@dataclass
class GateScorer:
    """Scores of one gate from activations of the union of its latents.

    ``columns`` are the latent ids in the order of the activation matrix the caller provides (the
    :class:`~guard.sae.SelectedEncoder` ids); every head indexes into them."""

    overall: Head
    columns: list[int]
    threshold: float
    pooling: Pooling = field(default_factory=Pooling)
    categories: dict[str, Head] = field(default_factory=dict)
    category_thresholds: dict[str, float] = field(default_factory=dict)
    context: ContextTerm | None = None
    # a second trigger: a probe over residual-probe columns (:class:`guard.sae.SelectedEncoder`), pooled the same
    # way, moved onto this gate's scale by ``probe_offset`` (the gate's threshold minus the probe's own), so
    # that c_t = max(read-out score, probe score + offset) crosses the threshold where either would alone
    probe: Head | None = None
    probe_offset: float = 0.0
    # or: c_t = read-out score + probe_weight * probe score, for a gate that reads the sum (the prompt gate)
    probe_weight: float | None = None
    # an added probe with a hidden layer: the probe head's columns are its units (:class:`HiddenLayer`)
    probe_hidden: HiddenLayer | None = None

    def __post_init__(self) -> None:
        pos = {c: i for i, c in enumerate(self.columns)}
        heads = [self.overall, *self.categories.values(), *([self.context.head] if self.context else []),
                 *([self.probe] if self.probe else [])]
        missing = sorted({j for h in heads for j in h.ids} - set(pos))
        if missing:
            raise ValueError(f"activation columns lack selected latents {missing[:8]}")
        if self.context is not None and self.pooling.final:
            raise ValueError("a context term belongs to a gate that scores a response after its context")
        if self.probe_hidden is not None and (self.probe is None or self.probe_weight is None
                                              or len(self.probe.ids) != self.probe_hidden.n_columns):
            raise ValueError("a hidden layer belongs to a probe added to the gate's score, one column per unit "
                             "and per linear weight")
        self._ov = _Readout(self.overall, pos)
        self._cat = {c: _Readout(h, pos) for c, h in self.categories.items()}
        self._ctx = None if self.context is None else _Readout(self.context.head, pos)
        self._probe = None if self.probe is None else _Readout(self.probe, pos)

    def with_threshold(self, threshold: float) -> GateScorer:
        return GateScorer(self.overall, self.columns, float(threshold), self.pooling, self.categories,
                          self.category_thresholds, self.context, self.probe, self.probe_offset, self.probe_weight,
                          self.probe_hidden)

    def probe_contributions(self, acts: np.ndarray) -> np.ndarray:
        """(T, n_columns) -> (T,) per-token contribution of the residual probe (zeros without one)."""
        a = np.atleast_2d(acts)
        return np.zeros(a.shape[0]) if self._probe is None else self._probe.contrib(a)

    def with_probe(self, c: np.ndarray, acts: np.ndarray) -> np.ndarray:
        """Scores c_t of the read-out (context term applied) -> the gate's scores with the residual probe's
        trigger on the same scale."""
        if self.probe is None or not len(c):
            return np.asarray(c)
        if self.probe_hidden is not None and self._probe is not None:
            units = np.atleast_2d(np.asarray(acts, dtype=np.float64))[:, self._probe.idx]
            cp = self.probe.bias + self.probe_hidden.apply(pool(units, self.pooling))
        else:
            cp = pool(self.probe_contributions(acts), self.pooling, self.probe.bias)
        if self.probe_weight is not None:
            return np.asarray(c) + self.probe_weight * cp
        return np.maximum(np.asarray(c), cp + self.probe_offset)

    def context_sum(self, acts: np.ndarray, kept: np.ndarray) -> tuple[float, int]:
        """The context read-out's summed contribution over the kept rows of (T, n_columns) and their count."""
        k = np.asarray(kept, dtype=bool)
        if self._ctx is None or not k.any():
            return 0.0, 0
        return float(self._ctx.contrib(np.atleast_2d(acts)[k]).sum()), int(k.sum())

    def context_effect(self, acts: np.ndarray, kept: np.ndarray) -> tuple[float, float]:
        """(offset, multiplier) of the context term for the context tokens' activations and norm-filter mask;
        (0, 1) without a term."""
        if self.context is None:
            return 0.0, 1.0
        return self.context.apply(*self.context_sum(acts, kept))

    def with_context(self, c: np.ndarray, offset: float, mult: float) -> np.ndarray:
        """Scores c_t of the read-out alone -> the scores with the context term."""
        b = self.overall.bias
        return b + mult * (np.asarray(c) - b) + offset

    def contributions(self, acts: np.ndarray) -> np.ndarray:
        """(T, n_columns) -> (T,) per-token u_t of the overall head."""
        return self._ov.contrib(np.atleast_2d(acts))

    def scores(self, acts: np.ndarray) -> np.ndarray:
        """(T, n_columns) of consecutive valid tokens -> (T,) pooled scores c_t."""
        return pool(self.contributions(acts), self.pooling, self.overall.bias)

    def category_scores(self, acts: np.ndarray) -> dict[str, np.ndarray]:
        a = np.atleast_2d(acts)
        return {c: pool(r.contrib(a), self.pooling, r.head.bias) for c, r in self._cat.items()}

    def category_of(self, cat_scores: dict[str, float]) -> str:
        """The category whose score, relative to its own calibrated threshold, is highest."""
        best, best_r = "unsafe", NEG
        for c, v in cat_scores.items():
            thr = self.category_thresholds.get(c)
            if thr is None:
                continue
            r = v - thr
            if r > best_r:
                best, best_r = c, r
        return best

    def top_features(self, acts_window: np.ndarray, n: int = 5) -> list[tuple[int, float]]:
        """Latents with the largest positive contribution w_j f_j summed over the pooling window that tripped
        the gate (rows = those tokens), with their largest activation there."""
        a = np.atleast_2d(np.asarray(acts_window, dtype=np.float64))
        contrib = (self._ov.features(a) * self._ov.w).sum(0)
        raw = a[:, self._ov.idx].max(0)
        order = np.argsort(-contrib, kind="stable")[:n]
        return [(int(self.overall.ids[i]), float(raw[i])) for i in order if contrib[i] > 0]


@dataclass
class SequenceScore:
    c: np.ndarray                 # pooled scores over the valid span
    score: float                  # max c (0 for an empty span)
    cut: int | None               # index into the valid span of the first c > threshold
    kept: np.ndarray              # norm-filter mask over the valid span
    acts: np.ndarray              # filtered activations over the valid span


def score_sequence(scorer: GateScorer, acts: np.ndarray, norms: np.ndarray, span: tuple[int, int],
                   threshold: float | None = None, norm_ratio: float = 10.0,
                   context_span: tuple[int, int] | None = None) -> SequenceScore:
    """Offline scoring of one formatted sample. ``acts``/``norms`` cover all tokens (context included)
    because the causal norm filter's median runs over every position from 0. ``context_span``: the tokens of
    the conversation a response answers (:attr:`guard.text.GuardText.context`), which a gate with a context
    term reads."""
    kept_all = causal_norm_mask(norms, norm_ratio)
    s, e = span
    a = np.asarray(acts, dtype=np.float64)[s:e] * kept_all[s:e, None]
    c = scorer.scores(a) if e > s else np.zeros(0)
    if scorer.context is not None and len(c):
        if context_span is None:
            raise ValueError("this gate's context term needs the token span of the conversation the response answers")
        cs, ce = context_span
        if cs >= ce:
            cs = ce = 0          # none of the conversation is left (a long one keeps its end): no term
        elif not 0 <= cs < ce <= s:
            raise ValueError(f"the context span {context_span} must lie before the scored span {span}")
        c = scorer.with_context(c, *scorer.context_effect(np.asarray(acts, dtype=np.float64)[cs:ce], kept_all[cs:ce]))
    c = scorer.with_probe(c, a)
    thr = scorer.threshold if threshold is None else threshold
    return SequenceScore(c=c, score=peak(c, scorer.pooling), cut=first_crossing(c, thr, scorer.pooling),
                         kept=kept_all[s:e], acts=a)


class StreamScorer:
    """Online version of :func:`score_sequence` for one stream: feed context tokens, then valid tokens."""

    def __init__(self, scorer: GateScorer, threshold: float | None = None, norm_ratio: float = 10.0) -> None:
        self.scorer = scorer
        self.threshold = scorer.threshold if threshold is None else float(threshold)
        self.norms = CausalNormFilter(norm_ratio)
        p = scorer.pooling
        if p.final:
            raise ValueError("a gate that scores the whole sequence at its last token cannot score a stream")
        if scorer.probe_weight is not None:
            # the added probe belongs to such a gate; a stream's trigger is the larger of the two scores
            raise ValueError("a gate whose probe is added to its score cannot score a stream")
        self._win: deque[float] = deque(maxlen=p.window)
        self._pwin: deque[float] = deque(maxlen=p.window)
        self._rows: deque[np.ndarray] = deque(maxlen=p.window)
        self.n_valid = 0
        self.max_c = NEG
        self.last: dict[str, Any] = {}
        self.offset, self.mult = 0.0, 1.0        # the gate's context term, fixed once the context is read
        self._ctx_sum, self._ctx_n = 0.0, 0

    def context(self, norms: Sequence[float], acts: np.ndarray | None = None,
                span: tuple[int, int] | None = None) -> None:
        """Tokens that are not scored (the conversation before the response) still feed the running median;
        a gate with a context term also reads their activations (``acts``, one row per norm) over ``span``
        (the rows of the conversation the response answers, as in :func:`score_sequence`)."""
        kept = [self.norms.step(float(x)) for x in norms]
        if self.scorer.context is not None:
            if acts is None or len(acts) != len(kept) or span is None:
                raise ValueError("this gate's context term needs the context tokens' activations, one row per norm, "
                                 "and the span of the conversation the response answers")
            a, b = span
            if not 0 <= a <= b <= len(kept):
                raise ValueError(f"context span {span} outside the {len(kept)} context rows")
            total, n = self.scorer.context_sum(np.asarray(acts, dtype=np.float64)[a:b], np.array(kept[a:b], dtype=bool))
            self._ctx_sum, self._ctx_n = self._ctx_sum + total, self._ctx_n + n
            self.offset, self.mult = self.scorer.context.apply(self._ctx_sum, self._ctx_n)

    def step(self, acts_row: np.ndarray, norm: float) -> tuple[float, bool]:
        """Score one valid token: returns (c_t, cut_now)."""
        kept = self.norms.step(float(norm))
        row = np.asarray(acts_row, dtype=np.float64) * (1.0 if kept else 0.0)
        p = self.scorer.pooling
        self._win.append(float(self.scorer.contributions(row[None, :])[0]))
        self._rows.append(row)
        self.n_valid += 1
        n = max(len(self._win), p.min_count)
        c = self.scorer.overall.bias + self.offset + self.mult * (sum(self._win) / n)
        self.last = {"c": c}
        if self.scorer.probe is not None:
            self._pwin.append(float(self.scorer.probe_contributions(row[None, :])[0]))
            cp = self.scorer.probe.bias + self.scorer.probe_offset + sum(self._pwin) / n
            self.last = {"c": max(c, cp), "readout": c, "probe": cp}
            c = max(c, cp)
        self.max_c = max(self.max_c, c)
        return c, bool(c > self.threshold)

    def snapshot(self) -> tuple[Any, ...]:
        """The running state, for :meth:`restore` after scoring tokens that may still change."""
        return (list(self.norms._sorted), deque(self._win, maxlen=self._win.maxlen),
                deque(self._pwin, maxlen=self._pwin.maxlen), deque(self._rows, maxlen=self._rows.maxlen),
                self.n_valid, self.max_c, dict(self.last), self.offset, self.mult)

    def restore(self, state: tuple[Any, ...]) -> None:
        sorted_norms, win, pwin, rows, self.n_valid, self.max_c, self.last, self.offset, self.mult = state
        self.norms._sorted = list(sorted_norms)
        self._win, self._rows = deque(win, maxlen=win.maxlen), deque(rows, maxlen=rows.maxlen)
        self._pwin = deque(pwin, maxlen=pwin.maxlen)

    @property
    def trigger(self) -> str:
        """Which trigger crossed at the last token: the read-out, or the residual probe alone."""
        return "residual_probe" if self.last.get("readout", math.inf) <= self.threshold else "readout"

    def cut_details(self) -> tuple[str, list[tuple[int, float]]]:
        """Category and top features of the window that ends at the last token (call right after a cut)."""
        rows = np.stack(list(self._rows))
        p = self.scorer.pooling
        cats = {}
        for c, r in self.scorer._cat.items():
            u = r.contrib(rows)
            cats[c] = r.head.bias + float(u.sum()) / max(len(u), p.min_count)
        # a cut the residual probe made alone names no latent: the read-out's top latents did not cause it
        return self.scorer.category_of(cats), [] if self.trigger == "residual_probe" else self.scorer.top_features(rows)
