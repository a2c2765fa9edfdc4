"""The response gate's context term: the conversation's own risk added to every score of its answer.

The dataset's unsafe answers are the served model's compliance with harmful requests. A 135M model's
compliance is mostly vague or off the point ("Sure, here is what you asked for: 1. The tutorial will be
delivered to you by email ..."), so what makes it unsafe is the request it answers, and a read-out over the
answer's tokens alone reads it much like any other answer. The prompt gate's read-out already measures a
request's risk. The response gate therefore reads P, the prompt read-out's mean over the context tokens, and
scores c'_t = b + e^(k·P) (c_t − b) + a·P (:class:`guard.monitor.ContextTerm`): the riskier the request, the
less evidence from the answer a cut needs, while a refusal, whose read-out evidence is negative, stays low.

The pair (a, k) is chosen from a small grid on the calibration split, and the threshold is set there at the
response budget as before. The choice is by F1 at that threshold, not by recall: the term lifts the refusals
and other safe answers to harmful requests, which the budget does not hold (it counts answers to benign
requests), so recall alone would always pick the strongest term. (0, 0) is one of the candidates, so on the
calibration split the term never does worse than the response read-out alone. The read-outs themselves stay
as fitted on the select split.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from guard.bundle import GateSpec, MonitorSpec
from guard.monitor import ContextTerm, GateScorer, causal_norm_mask
from guard.recipe import calibration as C
from guard.recipe.sources import Sample
from guard.text import token_span

log = logging.getLogger(__name__)

# (a, k): the additive weight and the scale exponent of the context term
CONTEXT_GRID = tuple((a, k) for a in (0.0, 0.1, 0.2, 0.35, 0.5) for k in (0.0, 0.05, 0.1, 0.15, 0.2))
DRIFT_SOURCE = "constructed/drift"


@dataclass(frozen=True)
class ContextScores:
    """One calibration answer: its response scores without the term and the context's summed contribution
    over its kept tokens (and their count)."""

    c: np.ndarray
    context_total: float
    context_n: int


def context_scores(spec: MonitorSpec, rows: Iterable[tuple[np.ndarray, np.ndarray, tuple[int, int], tuple[int, int]]],
                   norm_ratio: float = 10.0) -> list[ContextScores]:
    """For each (activations of every token, residual norms, scored span, the answered conversation's span):
    the response gate's c_t without a context term and the prompt read-out's summed contribution over the
    conversation's kept tokens, both as served (:func:`guard.monitor.score_sequence`)."""
    g = spec.gates["response"]
    plain = GateScorer(g.overall, spec.encoder.columns, g.threshold, g.pooling)
    reader = GateScorer(g.overall, spec.encoder.columns, g.threshold, g.pooling,
                        context=ContextTerm(spec.gates["prompt"].overall))
    out = []
    for acts, norms, (s, e), (cs, ce) in rows:
        kept = causal_norm_mask(norms, norm_ratio)
        a = np.asarray(acts, dtype=np.float64)
        c = plain.scores(a[s:e] * kept[s:e, None]) if e > s else np.zeros(0)
        out.append(ContextScores(c, *reader.context_sum(a[cs:ce], kept[cs:ce])))
    return out


def answer_kind(s: Sample) -> str:
    """A calibration answer's kind: drift stream, unsafe, benign, refusal or other safe answer."""
    if s.source == DRIFT_SOURCE:
        return "drift"
    if s.label:
        return "unsafe"
    if s.source.startswith("generator/benign"):
        return "benign"
    return "refusal" if "refusal" in s.source else "other_safe"


def fit_context_term(spec: MonitorSpec, samples: Sequence[Sample], scores: Sequence[ContextScores], budget: float,
                     grid: Sequence[tuple[float, float]] = CONTEXT_GRID) -> tuple[GateSpec, dict[str, Any]]:
    """The response gate with the calibration split's best context term of ``grid`` (F1 at the budget's
    threshold; the weaker term on a tie) and that threshold; and the record of every term tried."""
    if len(samples) != len(scores):
        raise ValueError(f"{len(samples)} samples but {len(scores)} scores")
    terms = sorted({(float(a), float(k)) for a, k in grid}, key=lambda t: (t[0] + t[1], t))
    if not terms or min(min(t) for t in terms) < 0:
        raise ValueError(f"the context grid must hold (weight, scale) pairs >= 0, got {list(grid)}")
    kinds = np.array([answer_kind(s) for s in samples])
    scored = kinds != "drift"
    benign = kinds == "benign"
    if not benign.any() or not (kinds == "unsafe").any():
        raise ValueError("fitting a context term needs benign and unsafe answers in the calibration split")
    y = np.array([bool(s.label) for s in samples])
    g = spec.gates["response"]
    b = g.overall.bias
    tried: list[dict[str, Any]] = []
    best: tuple[dict[str, Any], np.ndarray] | None = None
    for a, k in terms:
        term = ContextTerm(g.overall, a, k)
        peak = np.full(len(scores), -np.inf)
        for i, x in enumerate(scores):
            if len(x.c):
                off, mult = term.apply(x.context_total, x.context_n)
                peak[i] = b + mult * (float(x.c.max()) - b) + off    # the multiplier is > 0: the peak stays the peak
        thr = C.threshold_at_budget(peak[benign], budget)
        flag = peak > thr
        p, r, f = C.prf(flag[scored], y[scored])
        rec = {"weight": a, "scale": k, "threshold": thr, "f1": f, "precision": p, "recall": r,
               "average_precision": C.average_precision(peak[scored], y[scored]),
               **{f"{kk}_cut": float(flag[kinds == kk].mean()) for kk in ("benign", "refusal", "other_safe", "drift")
                  if (kinds == kk).any()}}
        tried.append(rec)
        if best is None or f > best[0]["f1"] + 1e-12:
            best = (rec, peak)
    assert best is not None
    rec, peak = best
    calibration = {**g.calibration, "context": {"chosen": rec, "tried": tried, "budget": budget,
                                                "n": {kk: int((kinds == kk).sum()) for kk in sorted(set(kinds))}}}
    if "without_context" not in calibration:
        calibration["without_context"] = {"threshold": g.threshold, "calib": g.calibration.get("calib")}
    strong = rec["weight"] > 0 or rec["scale"] > 0
    new = replace(g, threshold=float(rec["threshold"]), calibration=calibration,
                  benign_scores=sorted(float(x) for x in peak[benign]),
                  context=ContextTerm(spec.gates["prompt"].overall, rec["weight"], rec["scale"]) if strong else None)
    log.info("response context term: weight %.2f scale %.2f, calib F1 %.3f (without %.3f), recall %.3f, refusals "
             "cut %.3f", rec["weight"], rec["scale"], rec["f1"], tried[0]["f1"], rec["recall"], rec.get("refusal_cut", 0.0))
    return new, calibration["context"]


def with_response_gate(spec: MonitorSpec, gate: GateSpec) -> MonitorSpec:
    """``spec`` with ``gate`` as its response gate. The context term reads the prompt gate's latents, which the
    monitor's encoder computes already."""
    missing = sorted(set(gate.all_ids()) - set(spec.encoder.ids))
    if missing:
        raise ValueError(f"the monitor's encoder lacks latents {missing[:8]} of the new response gate")
    return MonitorSpec(spec.encoder, {"prompt": spec.gates["prompt"], "response": gate}, spec.name, spec.info,
                       spec.reference)


def served_rank(prompt: GateSpec, sae: Any, cache: Any, layer: int, tok: Any, samples: Sequence[Sample],
                cal_idx: Sequence[int], budget: float, grid: Sequence[tuple[float, float]]
                ) -> Callable[[GateSpec], tuple[float, float]]:
    """How a response read-out variant ranks as it would be served: with the best context term of ``grid``
    fitted for it on the calibration answers ``cal_idx`` (positions in ``samples`` and the cache), its F1 at
    the budget's threshold, then its recall. A read-out ranked by its own recall at the budget can lose to
    another once the request's risk scales both."""
    cal = [samples[i] for i in cal_idx]

    def rank(gate: GateSpec) -> tuple[float, float]:
        spec = MonitorSpec.from_gates({"prompt": prompt, "response": gate}, sae, "variant")
        _, rec = fit_context_term(spec, cal, context_scores(spec, cache_rows(cache, layer, spec, tok, samples, cal_idx)),
                                  budget, grid)
        return float(rec["chosen"]["f1"]), float(rec["chosen"]["recall"])
    return rank


def cache_rows(cache: Any, layer: int, spec: MonitorSpec, tok: Any, samples: Sequence[Sample], idx: Sequence[int]
               ) -> Iterable[tuple[np.ndarray, np.ndarray, tuple[int, int], tuple[int, int]]]:
    """(the monitor's latents, residual norms, scored span, the answered conversation's span) of the cached
    response samples ``idx`` (positions in ``samples`` and in the cache)."""
    from guard.recipe.encode import guard_tokens

    for i in idx:
        ids, offs, span, gt = guard_tokens(tok, samples[i])
        if gt.context is None:
            raise ValueError(f"sample {i} is not a response: it has no conversation it answers")
        resid = cache.rows(layer, i)
        drop = len(ids) - int(resid.shape[0])      # a long conversation keeps its end in the cache
        if drop < 0 or (max(0, span[0] - drop), max(0, span[1] - drop)) != cache.span(i):
            raise ValueError(f"sample {i}'s tokens do not match its cached row")
        yield (spec.encoder.encode(resid).numpy(), resid.norm(dim=-1).numpy(), cache.span(i),
               token_span(offs[drop:], *gt.context))
