"""Sample-level feature selection (NExT-Guard Stage 1) from sample labels only.

* Input formatting follows the reference code: ``"User: {prompt}"`` for a prompt sample and
  ``"User: {prompt}\\nAssistant: {response}"`` for a response sample, no chat template, no BOS.
* The *valid* tokens (prompt tokens, or response tokens with the prompt as context) are found from
  character offsets, not from the length of the tokenised prefix: BPE tokenisers merge the
  prefix's trailing space into the next word, which makes the prefix-length rule skip a token.
* For each sample and latent the statistic uses X_ij = max over valid tokens of a_ij.
* Score s_j = (mu+_j - mu-_j) / (sigma+ + sigma- + eps), with sigma either per feature (the paper's
  notation) or the reference code's single global sigma (std of the vector of per-feature means).
* Keep the top K (32) with s_j > 0; their s_j are the weights of the token score c_t.
* Optional label-free density filter (our addition, off by default in the function): latents that fire on
  more than a given fraction of all valid tokens of the select split (both classes pooled) are excluded
  before ranking. Such dense latents fire somewhere in nearly every sample, so their sample max mostly
  tracks the sample's length rather than its content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

SigmaMode = Literal["per_feature", "global"]

PROMPT_PREFIX = "User: "
RESPONSE_SEP = "\nAssistant: "


@dataclass(frozen=True, slots=True)
class FormattedSample:
    text: str
    char_start: int      # first character of the valid span
    char_end: int        # one past the last character


def format_sample(prompt: str, response: str | None = None) -> FormattedSample:
    """The reference code's plain-text format and the character span of the valid part."""
    head = PROMPT_PREFIX + prompt
    if response is None:
        return FormattedSample(head, len(PROMPT_PREFIX), len(head))
    text = head + RESPONSE_SEP + response
    return FormattedSample(text, len(head) + len(RESPONSE_SEP), len(text))


def token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int]:
    """Token index range [start, end) of the tokens that overlap [char_start, char_end).

    A token counts as valid if any of its non-space characters fall inside the span; a token made of
    the separator's trailing space plus the first word ("Ġword") therefore belongs to the span.
    Zero-width tokens (BOS, special tokens) never count.
    """
    start = end = None
    for i, (a, b) in enumerate(offsets):
        if b <= a:
            continue
        if b > char_start and a < char_end:
            if start is None:
                start = i
            end = i + 1
    if start is None or end is None:
        return (len(offsets), len(offsets))
    return (start, end)


def sample_max(acts: Sequence[np.ndarray], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """X[i, j] = max over valid tokens of sample i of latent j (0 for an empty span)."""
    if len(acts) != len(spans):
        raise ValueError(f"{len(acts)} activation matrices but {len(spans)} spans")
    d = acts[0].shape[1]
    out = np.zeros((len(acts), d), dtype=np.float32)
    for i, (a, (s, e)) in enumerate(zip(acts, spans, strict=True)):
        if e > s:
            out[i] = a[s:e].max(axis=0)
    return out


def token_density(acts: Sequence[np.ndarray], spans: Sequence[tuple[int, int]],
                  keep: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """Firing rate of each latent over all valid tokens of all samples (no labels): the fraction of valid
    tokens with a_tj > 0. ``keep`` (one boolean vector per sample, e.g. the causal norm filter) drops tokens
    from the count; tokens outside the spans never count. All zeros when there is no valid token."""
    if len(acts) != len(spans) or (keep is not None and len(keep) != len(acts)):
        raise ValueError("acts, spans (and keep) must have one entry per sample")
    d = acts[0].shape[1]
    fired = np.zeros(d, dtype=np.int64)
    n = 0
    for i, (a, (s, e)) in enumerate(zip(acts, spans, strict=True)):
        if e <= s:
            continue
        rows = a[s:e]
        if keep is not None:
            rows = rows[np.asarray(keep[i][s:e], dtype=bool)]
        fired += (rows > 0).sum(axis=0)
        n += rows.shape[0]
    return (fired / max(n, 1)).astype(np.float32)


def diff_scores(X: np.ndarray, y: np.ndarray, sigma: SigmaMode = "per_feature", eps: float = 1e-6) -> np.ndarray:
    """Standardised mean difference per latent.

    ``per_feature``: sigma+/- are the per-latent standard deviations of X over unsafe/safe samples.
    ``global``: the reference code's quirk, sigma+/- are single scalars (std over latents of the
    per-latent means), so the ranking equals the raw mean difference.
    """
    y = np.asarray(y).astype(bool)
    if y.all() or (~y).all():
        raise ValueError("feature selection needs both unsafe and safe samples")
    pos, neg = X[y], X[~y]
    mu_p, mu_n = pos.mean(0), neg.mean(0)
    if sigma == "per_feature":
        den = pos.std(0) + neg.std(0) + eps
    elif sigma == "global":
        den = np.full_like(mu_p, float(mu_p.std()) + float(mu_n.std()) + eps)
    else:
        raise ValueError(f"Unknown sigma mode '{sigma}'. Available: per_feature, global")
    return ((mu_p - mu_n) / den).astype(np.float32)


@dataclass
class FeatureSet:
    """Selected latents and their weights s_j for one gate and one category ('all' = any harm)."""

    ids: list[int]
    weights: list[float]
    category: str = "all"
    sigma: str = "per_feature"
    n_pos: int = 0
    n_neg: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"ids": self.ids, "weights": self.weights, "category": self.category, "sigma": self.sigma,
                "n_pos": self.n_pos, "n_neg": self.n_neg}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSet:
        known = {k: d[k] for k in ("ids", "weights", "category", "sigma", "n_pos", "n_neg") if k in d}
        fs = cls(**known)
        if len(fs.ids) != len(fs.weights):
            raise ValueError(f"feature set '{fs.category}': {len(fs.ids)} ids but {len(fs.weights)} weights")
        return fs


def select_features(
    X: np.ndarray, y: np.ndarray, k: int = 32, sigma: SigmaMode = "per_feature", category: str = "all",
    allowed: np.ndarray | None = None,
) -> FeatureSet:
    """Top-k latents by standardised mean difference, positive scores only.

    ``allowed`` (boolean per latent) excludes latents before ranking; the scores of the others (their σ,
    and with ``sigma="global"`` the global σ) are computed exactly as without it."""
    s = diff_scores(X, y, sigma)
    order = np.argsort(-s, kind="stable")
    if allowed is not None:
        order = order[np.asarray(allowed, dtype=bool)[order]]
    keep = [int(j) for j in order[:k] if s[j] > 0]
    y = np.asarray(y).astype(bool)
    return FeatureSet(ids=keep, weights=[float(s[j]) for j in keep], category=category, sigma=sigma,
                      n_pos=int(y.sum()), n_neg=int((~y).sum()))


@dataclass
class GateFeatures:
    """The overall feature set of a gate plus one set per harm category (so a cut can name one)."""

    overall: FeatureSet
    categories: dict[str, FeatureSet] = field(default_factory=dict)

    def all_ids(self) -> list[int]:
        ids = set(self.overall.ids)
        for fs in self.categories.values():
            ids.update(fs.ids)
        return sorted(ids)

    def to_dict(self) -> dict[str, Any]:
        return {"overall": self.overall.to_dict(), "categories": {c: f.to_dict() for c, f in self.categories.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateFeatures:
        return cls(FeatureSet.from_dict(d["overall"]),
                   {c: FeatureSet.from_dict(f) for c, f in d.get("categories", {}).items()})


def select_gate_features(
    X: np.ndarray, y: np.ndarray, categories: Sequence[str | None], k: int = 32,
    sigma: SigmaMode = "per_feature", min_category_samples: int = 8, allowed: np.ndarray | None = None,
) -> GateFeatures:
    """Overall set on all samples; one set per category: its unsafe samples against all safe samples.

    Categories with fewer than ``min_category_samples`` unsafe samples get no set of their own.
    ``allowed`` (boolean per latent, e.g. ``token_density(...) <= cutoff``) applies to every set.
    """
    y = np.asarray(y).astype(bool)
    overall = select_features(X, y, k, sigma, allowed=allowed)
    cats: dict[str, FeatureSet] = {}
    names = sorted({c for c, lab in zip(categories, y, strict=True) if lab and c})
    for c in names:
        mask = np.array([(not lab) or (cc == c) for cc, lab in zip(categories, y, strict=True)])
        if int((y & mask).sum()) < min_category_samples:
            continue
        fs = select_features(X[mask], y[mask], k, sigma, category=c, allowed=allowed)
        if fs.ids:
            cats[c] = fs
    return GateFeatures(overall, cats)
