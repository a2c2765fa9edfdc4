"""Stage 4 of the build: choosing the risk latents and their weights from sample-level labels only.

**The reference rule** (the paper's code): per-sample max of every latent over the scored tokens, standardised
mean difference between unsafe and safe samples, the top K positive latents weighted by their difference;
token score = weighted sum, cut at the first crossing (:func:`reference_head`).

**The sparse pooled read-out** (the default): a linear read-out over the SAE latents whose *deployed* score —
a causal window mean of the per-token contributions, maxed over the stream — is fitted directly to the
sample labels (multiple-instance learning: a safe sample must stay low at every token, an unsafe one must
rise somewhere). An L1 penalty picks a few latents; the kept latents are refitted without it. Because the
score is a window mean, a long benign answer is not pushed over the threshold by its length, and because
every token of a safe sample is a negative, latents that fire all over benign answers get no weight.

**The sample-mean read-out** (``HeadConfig.fit = "sample_mean"``; ``BuildConfig.prompt_head_fit``): the same
candidates, each sample represented by the mean of its latents over its scored tokens, standardised, and an
L2 logistic regression on the sample labels (every sample weighs the same); the ``max_latents`` largest
standardised weights are kept and refitted. It is served through the same causal window as any read-out.
Measured over a fixed set of latents, it generalised better to requests the fit never saw than the
window-max fit, which with group-balanced weights gives a source of a handful of samples the weight of a
large one and fits the window's spikes; in a full build, choosing its own latents (top candidates by
difference), it lost on the test split. What the build does instead is refit the prompt gate this way over the
latents the window-max read-outs of both gates chose (:func:`fit_sample_mean_head`;
``guard.recipe.pipeline.refit_prompt_gate``), keeping it only where it recalls more on the calibration split.

Label-free pre-filter: latents that fire on more than ``max_density`` of the tokens of the served model's
benign answers are excluded before fitting (they say more about "an answer is being written" than about
its content). Nothing here reads token-level labels or a stream's onset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from guard.monitor import Head, Pooling
from guard.recipe.encode import TokenData

log = logging.getLogger(__name__)


FITS = ("window_max", "sample_mean", "sample_mean_all")


@dataclass
class HeadConfig:
    window: int = 16
    min_count: int = 4
    l1: float = 3e-3
    l2: float = 1e-4
    max_latents: int = 64
    candidates: int = 1536
    max_density: float = 0.05
    min_samples: int = 5           # a candidate latent fires in at least this many select samples
    clip: float = 4.0
    steps: int = 300
    refit_steps: int = 200
    lr: float = 0.05
    tau: float = 0.25              # soft-max temperature over a sample's tokens during fitting
    seed: int = 0
    threads: int = 2
    fit: str = "window_max"        # "window_max" (multiple-instance, L1), "sample_mean" or "sample_mean_all" (L2 logistic)
    c_reg: float = 0.03            # sample_mean*: inverse L2 strength on standardised features
    final: bool = False            # served with a final pooling (the last token decides: monitor.Pooling.final)

    def __post_init__(self) -> None:
        if self.fit not in FITS:
            raise ValueError(f"Unknown read-out fit '{self.fit}'. Available: {', '.join(FITS)}")

    def pooling(self) -> Pooling:
        return Pooling(self.window, min(self.min_count, self.window), self.final)


def token_density(td: TokenData, samples: Sequence[int] | None = None) -> np.ndarray:
    """Share of the (given samples') scored tokens at which each latent fires."""
    sub = td if samples is None else td.subset(samples)
    fired = np.bincount(sub.indices, minlength=sub.width).astype(np.float64)
    return fired / max(sub.n_tokens, 1)


def latent_scales(td: TokenData) -> np.ndarray:
    """Mean non-zero activation of each latent (1 where it never fires): puts latents on a common scale."""
    s = np.bincount(td.indices, weights=td.values, minlength=td.width)
    c = np.bincount(td.indices, minlength=td.width)
    return np.where(c > 0, s / np.maximum(c, 1), 1.0).astype(np.float64)


def diff_scores(X: np.ndarray, y: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Standardised mean difference per latent, per-feature sigma (the paper's notation)."""
    y = np.asarray(y).astype(bool)
    if y.all() or (~y).all():
        raise ValueError("feature selection needs both unsafe and safe samples")
    pos, neg = X[y], X[~y]
    return ((pos.mean(0) - neg.mean(0)) / (pos.std(0) + neg.std(0) + eps)).astype(np.float64)


def reference_head(td: TokenData, y: np.ndarray, k: int = 32, allowed: np.ndarray | None = None,
                   category: str = "all") -> Head:
    """The paper's selection: top-k positive standardised differences of per-sample max activations."""
    s = diff_scores(td.sample_max(), y)
    order = np.argsort(-s, kind="stable")
    if allowed is not None:
        order = order[allowed[order]]
    keep = [int(j) for j in order[:k] if s[j] > 0]
    return Head(ids=keep, weights=[float(s[j]) for j in keep], category=category,
                info={"rule": "reference: top-k standardised mean difference of per-sample max"})


class _Problem:
    """The fitting problem in torch: gathered token features of the candidate latents and the pooling indices."""

    def __init__(self, td: TokenData, cand: np.ndarray, scales: np.ndarray, cfg: HeadConfig) -> None:
        import torch

        col = np.full(td.width, -1, dtype=np.int64)
        col[cand] = np.arange(len(cand))
        row_of_nz = np.repeat(np.arange(td.n_tokens), np.diff(td.indptr))
        c = col[td.indices]
        m = c >= 0
        self.rows = torch.from_numpy(row_of_nz[m])
        self.cols = torch.from_numpy(c[m])
        self.vals = torch.from_numpy(np.minimum(td.values[m] / scales[td.indices[m]], cfg.clip).astype(np.float32))
        lens = td.lengths()
        self.n_tok = td.n_tokens
        seg = np.repeat(np.arange(td.n_samples), lens)
        local = np.arange(td.n_tokens) - np.repeat(td.sample_ptr[:-1], lens)
        n = np.minimum(local + 1, cfg.window)
        self.hi = torch.from_numpy(np.arange(td.n_tokens) + 1)
        self.lo = torch.from_numpy(np.arange(td.n_tokens) + 1 - n)
        self.den = torch.from_numpy(np.maximum(n, min(cfg.min_count, cfg.window)).astype(np.float32))
        self.seg = torch.from_numpy(seg)
        self.n_samples = td.n_samples
        self.empty = torch.from_numpy(lens == 0)

    def pooled(self, w: Any, b: Any) -> Any:
        import torch

        u = torch.zeros(self.n_tok).index_add(0, self.rows, self.vals * w[self.cols])
        cs = torch.cat([torch.zeros(1), u.cumsum(0)])
        return b + (cs[self.hi] - cs[self.lo]) / self.den

    def sample_scores(self, c: Any, tau: float | None) -> Any:
        import torch

        m = torch.full((self.n_samples,), -1e9).scatter_reduce(0, self.seg, c.detach(), "amax", include_self=True)
        if tau is None:
            out = torch.full((self.n_samples,), -1e9).scatter_reduce(0, self.seg, c, "amax", include_self=True)
        else:
            e = torch.exp((c - m[self.seg]) / tau)
            s = torch.zeros(self.n_samples).index_add(0, self.seg, e)
            out = m + tau * torch.log(s.clamp_min(1e-30))
        return torch.where(self.empty, torch.full_like(out, -10.0), out)


def _fit(prob: _Problem, y: np.ndarray, sw: np.ndarray, cfg: HeadConfig, l1: float, steps: int,
         w0: Any | None = None, mask: Any | None = None) -> tuple[Any, Any, list[float]]:
    import torch

    torch.manual_seed(cfg.seed)
    n = int(prob.cols.max()) + 1 if len(prob.cols) else 1
    w = torch.zeros(n) if w0 is None else w0.clone()
    w.requires_grad_(True)
    b = torch.tensor(-2.0, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=cfg.lr)
    yt = torch.from_numpy(y.astype(np.float32))
    swt = torch.from_numpy(sw.astype(np.float32))
    losses = []
    for step in range(steps):
        ww = w if mask is None else w * mask
        c = prob.pooled(ww, b)
        z = prob.sample_scores(c, cfg.tau)
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(z, yt, reduction="none") * swt).sum() / swt.sum()
        reg = l1 * ww.abs().sum() + cfg.l2 * (ww ** 2).sum()
        opt.zero_grad()
        (loss + reg).backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            losses.append(float(loss.detach()))
    return (w.detach() if mask is None else (w * mask).detach()), b.detach(), losses


def balanced_weights(y: np.ndarray, groups: Sequence[str] | None = None) -> np.ndarray:
    """Each class weighs the same; within a class, each source group weighs the same (a big source does not
    drown a small one)."""
    y = np.asarray(y).astype(int)
    w = np.ones(len(y), dtype=np.float64)
    for lab in (0, 1):
        idx = np.flatnonzero(y == lab)
        if not len(idx):
            continue
        if groups is None:
            w[idx] = 1.0 / len(idx)
        else:
            g = np.array([groups[i] for i in idx])
            uniq, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
            w[idx] = 1.0 / (len(uniq) * counts[inv])
    return w * len(y) / w.sum()


def fit_head(td: TokenData, y: np.ndarray, cfg: HeadConfig, *, benign_tokens: TokenData | None = None,
             sample_groups: Sequence[str] | None = None, category: str = "all", max_latents: int | None = None) -> Head:
    """The read-out ``cfg.fit`` names (see the module docstring)."""
    import torch

    torch.set_num_threads(cfg.threads)
    t0 = time.time()
    y = np.asarray(y).astype(int)
    if cfg.fit == "sample_mean_all":
        # every latent that fires in enough samples: no density pre-filter (a whole-request mean is not
        # inflated by a latent that fires on every token) and no ranking before the fit
        fires_in = (td.sample_max() > 0).sum(0)
        cand = np.flatnonzero(fires_in >= cfg.min_samples)
        return _fit_sample_mean(td, y, cand, cfg, category, max_latents or cfg.max_latents, t0, balanced=True)
    dens = token_density(benign_tokens if benign_tokens is not None else td.subset(np.flatnonzero(y == 0).tolist()))
    X = td.sample_max()
    fires_in = (X > 0).sum(0)
    allowed = (dens <= cfg.max_density) & (fires_in >= cfg.min_samples)
    s = np.abs(diff_scores(X, y))
    s[~allowed] = -1
    cand = np.argsort(-s, kind="stable")[: cfg.candidates]
    cand = np.sort(cand[s[cand] >= 0])
    if cfg.fit == "sample_mean":
        return _fit_sample_mean(td, y, cand, cfg, category, max_latents or cfg.max_latents, t0)
    scales = latent_scales(td)
    prob = _Problem(td, cand, scales, cfg)
    sw = balanced_weights(y, sample_groups)
    w, b, losses = _fit(prob, y, sw, cfg, cfg.l1, cfg.steps)
    k = max_latents or cfg.max_latents
    mag = w.abs().numpy() * np.array([1.0] * len(cand))
    order = np.argsort(-mag, kind="stable")
    keep = order[: k][mag[order[: k]] > 1e-3 * max(mag.max(), 1e-12)]
    mask = torch.zeros_like(w)
    mask[torch.from_numpy(keep)] = 1.0
    w2, b2, losses2 = _fit(prob, y, sw, cfg, 0.0, cfg.refit_steps, w0=w, mask=mask)
    keep = np.sort(keep)
    ids = [int(cand[i]) for i in keep]
    head = Head(ids=ids, weights=[float(w2[i]) for i in keep], scales=[float(scales[j]) for j in ids], bias=float(b2),
                clip=cfg.clip, category=category,
                info={"rule": "sparse pooled read-out, multiple-instance fit on sample labels", "window": cfg.window,
                      "min_count": cfg.min_count, "l1": cfg.l1, "max_latents": k, "candidates": len(cand),
                      "dense_dropped": int((dens > cfg.max_density).sum()), "loss_l1_fit": losses,
                      "loss_refit": losses2, "seconds": time.time() - t0})
    log.info("head %s: %d latents (%d candidates), loss %.4f -> %.4f, %.0fs", category, len(ids), len(cand),
             losses[0], losses2[-1], time.time() - t0)
    return head


def sample_means(td: TokenData, columns: np.ndarray) -> np.ndarray:
    """(n_samples, len(columns)): each sample's mean activation of each column over its scored tokens."""
    col = np.full(td.width, -1, dtype=np.int64)
    col[columns] = np.arange(len(columns))
    lens = td.lengths()
    row_sample = np.repeat(np.arange(td.n_samples), lens)
    row_of_nz = np.repeat(np.arange(td.n_tokens), np.diff(td.indptr))
    c = col[td.indices]
    m = c >= 0
    flat = row_sample[row_of_nz[m]] * len(columns) + c[m]
    out = np.bincount(flat, weights=td.values[m], minlength=td.n_samples * len(columns))
    return out.reshape(td.n_samples, len(columns)) / np.maximum(lens, 1)[:, None]


def fit_sample_mean_head(td: TokenData, y: np.ndarray, columns: np.ndarray, cfg: HeadConfig,
                         category: str = "all") -> Head:
    """The sample-mean read-out over exactly ``columns`` (no candidate ranking; the ``cfg.max_latents``
    largest standardised weights are kept)."""
    return _fit_sample_mean(td, np.asarray(y).astype(int), np.asarray(columns, dtype=np.int64), cfg, category,
                            cfg.max_latents, time.time())


def _fit_sample_mean(td: TokenData, y: np.ndarray, cand: np.ndarray, cfg: HeadConfig, category: str,
                     k: int, t0: float, balanced: bool = False) -> Head:
    """``balanced``: each class weighs the same (the generated negatives make the benign side the larger)."""
    from sklearn.linear_model import LogisticRegression

    X = sample_means(td, cand)
    sd = X.std(0) + 1e-6

    def fit(cols: np.ndarray) -> tuple[np.ndarray, float]:
        clf = LogisticRegression(C=cfg.c_reg, max_iter=5000, class_weight="balanced" if balanced else None
                                 ).fit(X[:, cols] / sd[cols], y)
        return clf.coef_[0], float(clf.intercept_[0])

    w, _ = fit(np.arange(len(cand)))
    order = np.argsort(-np.abs(w), kind="stable")
    keep = np.sort(order[:k][np.abs(w[order[:k]]) > 1e-6 * max(np.abs(w).max(), 1e-12)])
    w2, b2 = fit(keep)
    ids = [int(cand[i]) for i in keep]
    # weights in raw activation units: the served score is bias + window mean of sum_j w_j a_j
    weights = [float(wi / sd[i]) for wi, i in zip(w2, keep, strict=True)]
    head = Head(ids=ids, weights=weights, bias=b2, category=category,
                info={"rule": "sample-mean read-out: L2 logistic on standardised per-sample mean latents"
                              + (" (every latent firing in enough samples; classes balanced)" if balanced else ""),
                      "window": cfg.window, "min_count": cfg.min_count, "c_reg": cfg.c_reg, "max_latents": k,
                      "candidates": len(cand), "seconds": time.time() - t0})
    log.info("head %s (sample mean): %d latents (%d candidates), %.0fs", category, len(ids), len(cand), time.time() - t0)
    return head


def head_sample_scores(td: TokenData, head: Head, pooling: Pooling) -> np.ndarray:
    """max_t c_t per sample under the deployed rule (the last c_t for a final pooling; 0 for an empty span),
    vectorised over all samples."""
    w = np.zeros(td.width)
    w[head.ids] = head.weights
    inv = np.ones(td.width)
    if head.scales is not None:
        inv[head.ids] = 1.0 / np.array(head.scales)
    clip = np.inf if head.clip is None else head.clip
    row_of_nz = np.repeat(np.arange(td.n_tokens), np.diff(td.indptr))
    contrib = np.minimum(td.values * inv[td.indices], clip) * w[td.indices]
    u = np.bincount(row_of_nz, weights=contrib, minlength=td.n_tokens)
    lens = td.lengths()
    local = np.arange(td.n_tokens) - np.repeat(td.sample_ptr[:-1], lens)
    n = np.minimum(local + 1, pooling.window)
    cs = np.concatenate([[0.0], np.cumsum(u)])
    idx = np.arange(td.n_tokens)
    c = head.bias + (cs[idx + 1] - cs[idx + 1 - n]) / np.maximum(n, pooling.min_count)
    out = np.full(td.n_samples, -np.inf)
    if pooling.final:
        has = lens > 0
        out[has] = c[td.sample_ptr[1:][has] - 1]
    else:
        np.maximum.at(out, np.repeat(np.arange(td.n_samples), lens), c)
    out[lens == 0] = 0.0
    return out
