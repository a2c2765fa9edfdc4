"""The evaluation ladder: where between the safeguard's own verdict and the shipped read-out the signal is lost.

Every rung scores the same samples and is thresholded the same way: at the budget (the share of the
calibration split's benign traffic it may flag), then measured on the test split by average precision
(threshold-free) and recall at that threshold. From the top:

1. ``posthoc_verdict``: the LoRA safeguard's own verdict on the whole text (no streaming; layer-free);
2. ``dense_pooled``: a logistic probe on the layer's residual, mean-pooled over the scored span;
3. ``dense_streamed``: that probe run causally through the deployed window, max over the stream;
4. ``sae_all_pooled`` / ``sae_all_streamed``: the same on all SAE latents instead of the residual;
5. ``sparse_readout``: the sparse read-out the build ships (at the served layer; refitted the same way at
   the other candidate layers);
6. ``paper_rule``: the paper's selection rule (top standardised mean differences) on the same SAE;
7. ``keywords``: a plain keyword list (layer-free).

A drop from one rung to the next says where to work: dense pooled -> streamed is the window, dense -> SAE is
the dictionary, SAE probe -> sparse read-out is the latent selection and fitting. Every rung also reports the
share it flags of each evaluation group of the test split (the caller names the groups: unsafe answers,
drift streams by whose text their unsafe part is, ...), so a loss that one group carries is visible apart from
the pooled recall.

All residuals come from the build's residual cache (the one forward per token the build ran), so the
ladder costs a few minutes where that cache is present, and one forward of the data where it is not.

Leave-one-source-out: the read-outs (sparse, and the probes for comparison) are refitted without one
family of unsafe sources and measured on that family's samples, none of which the refit saw. The SAE and
the safeguard LoRA are not retrained (the LoRA saw the family's select samples; the base monitor's
network never did), which the report states beside the numbers.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from guard.monitor import Pooling, causal_norm_mask, peak, pool
from guard.recipe import calibration as C
from guard.recipe.sources import Sample

log = logging.getLogger(__name__)
GATES = ("prompt", "response")
PROBE_C = (0.01, 0.1, 1.0)
# the leave-outs: each gate refitted on its own, and both together as a conversation meets them
LOSO_PARTS = ("gates", "end_to_end")


# ------------------------------------------------------------------------------------------------
# features from a residual cache

def span_rows(cache: Any, layer: int, i: int, norms: np.ndarray, ratio: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """Global cache rows of sample i's scored span and the serve-time norm filter over them."""
    a0, n = int(cache.starts[i]), int(cache.lengths[i])
    kept = causal_norm_mask(norms[a0:a0 + n], ratio)
    a, b = cache.span(i)
    return np.arange(a0 + a, a0 + b, dtype=np.int64), kept[a:b]


def residual_features(cache: Any, layer: int, idx: Sequence[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per sample: the mean residual over the kept span tokens, and the span's residuals (filtered rows
    zero, as the deployed scorer sees them) for streaming a linear probe."""
    from guard.recipe.cache import bits_to_float
    from guard.recipe.sae import cache_norms

    norms = cache_norms(cache, layer)
    arr = cache.array(layer)
    d = arr.shape[1]
    pooled = np.zeros((len(idx), d), dtype=np.float32)
    spans: list[np.ndarray] = []
    for k, i in enumerate(idx):
        rows, kept = span_rows(cache, layer, i, norms)
        x = bits_to_float(np.asarray(arr[rows])).numpy() if len(rows) else np.zeros((0, d), np.float32)
        x = x * kept[:, None]
        if kept.any():
            pooled[k] = x[kept].mean(0)
        spans.append(x.astype(np.float32))
    return pooled, spans


def sae_pooled(td: Any) -> np.ndarray:
    """(n_samples, width) mean SAE activation over each sample's scored span (filtered tokens count as 0)."""
    X = np.zeros((td.n_samples, td.width), dtype=np.float32)
    lens = td.lengths()
    tok_sample = np.repeat(np.arange(td.n_samples), lens)
    row_of_nz = np.repeat(np.arange(td.n_tokens), np.diff(td.indptr))
    np.add.at(X, (tok_sample[row_of_nz], td.indices), td.values)
    return X / np.maximum(lens, 1)[:, None]


@dataclass
class LinearProbe:
    """A logistic probe with its standardisation folded in: logit = w . x + b."""

    w: np.ndarray
    b: float
    C: float

    def pooled(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=np.float64) @ self.w + self.b

    def streamed_dense(self, spans: Sequence[np.ndarray], pooling: Pooling) -> np.ndarray:
        return np.array([peak(pool(x.astype(np.float64) @ self.w, pooling, self.b), pooling) if len(x) else self.b
                         for x in spans])

    def streamed_sparse(self, td: Any, pooling: Pooling) -> np.ndarray:
        row_of_nz = np.repeat(np.arange(td.n_tokens), np.diff(td.indptr))
        u = np.bincount(row_of_nz, weights=td.values * self.w[td.indices], minlength=td.n_tokens)
        out = np.full(td.n_samples, self.b)
        for i in range(td.n_samples):
            a, e = int(td.sample_ptr[i]), int(td.sample_ptr[i + 1])
            if e > a:
                out[i] = peak(pool(u[a:e], pooling, self.b), pooling)
        return out


def _calib_ap(scores: np.ndarray, yc: np.ndarray) -> float:
    """Average precision on the calibration split, 0 where it holds one class only (nothing to rank)."""
    return C.average_precision(scores, yc) if 0 < yc.sum() < len(yc) else 0.0


def fit_probe(X: np.ndarray, y: np.ndarray, Xc: np.ndarray, yc: np.ndarray, seed: int = 0) -> LinearProbe:
    """Class-balanced L2 logistic regression on standardised features; C chosen by calibration-split AP."""
    from sklearn.linear_model import LogisticRegression

    mu = X.mean(0)
    sd = X.std(0)
    sd[sd < 1e-6] = 1.0
    Z = (X - mu) / sd
    best: LinearProbe | None = None
    best_ap = -1.0
    for c in PROBE_C:
        m = LogisticRegression(C=c, class_weight="balanced", max_iter=2000, random_state=seed)
        m.fit(Z, y)
        w = m.coef_[0] / sd
        p = LinearProbe(w, float(m.intercept_[0] - (m.coef_[0] * mu / sd).sum()), c)
        ap = _calib_ap(p.pooled(Xc), yc)
        if ap > best_ap:
            best, best_ap = p, ap
    assert best is not None
    return best


@dataclass
class HiddenProbe:
    """A probe with one hidden layer of ReLU units on the pooled residual, its standardisation folded into the
    first layer: logit = w2 . relu(W1^T x + b1) + b2. Several fits (seeds) averaged are one wider layer with
    their output weights divided by their number, which is how :func:`fit_hidden_probe` returns them."""

    W1: np.ndarray      # (d, units)
    b1: np.ndarray      # (units,)
    w2: np.ndarray      # (units,)
    b2: float
    info: dict[str, Any]
    # a line beside the hidden layer, its weight and bias folded in (``lin`` over the features, its bias in b2)
    lin: np.ndarray | None = None

    def pooled(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        out = np.maximum(X @ self.W1 + self.b1, 0.0) @ self.w2 + self.b2
        return out if self.lin is None else out + X @ self.lin


# the prompt gate's hidden-layer probe: a narrow layer, strong dropout and weight decay, because the requests it
# must generalise to are worded unlike the generated ones it is mostly fitted on
HIDDEN_DROPOUT = 0.5
HIDDEN_WEIGHT_DECAY = 0.1
HIDDEN_EPOCHS = 40
HIDDEN_SEEDS = 5


def fit_hidden_probe(X: np.ndarray, y: np.ndarray, Xc: np.ndarray, yc: np.ndarray, units: int = 64,
                     seeds: int = HIDDEN_SEEDS, epochs: int = HIDDEN_EPOCHS, linear: bool = False) -> HiddenProbe:
    """Class-balanced fits of one hidden layer on standardised features (dropout on the input and the units,
    AdamW), each seed's epoch kept by calibration-split average precision; the seeds are averaged. ``linear``:
    add :func:`fit_probe`'s logit on the same features, weighted by the ratio of the two probes' spreads over the
    calibration split's negatives, so that neither part dominates the sum by scale alone."""
    import torch

    mu = X.mean(0)
    sd = X.std(0)
    sd[sd < 1e-6] = 1.0
    Z = torch.tensor((X - mu) / sd, dtype=torch.float32)
    Zc = torch.tensor((Xc - mu) / sd, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)
    ratio = float((1 - y).sum()) / max(float(y.sum()), 1.0)
    # each class weighs the same in the loss, whatever its share of the fitting samples
    sw = torch.where(yt > 0, torch.tensor(ratio ** 0.5), torch.tensor(ratio ** -0.5))
    W1, b1, w2, b2, aps = [], [], [], [], []
    for seed in range(seeds):
        torch.manual_seed(seed)
        lin_in, lin_out = torch.nn.Linear(Z.shape[1], units), torch.nn.Linear(units, 1)
        net = torch.nn.Sequential(torch.nn.Dropout(HIDDEN_DROPOUT), lin_in, torch.nn.ReLU(),
                                  torch.nn.Dropout(HIDDEN_DROPOUT), lin_out)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=HIDDEN_WEIGHT_DECAY)
        best, best_ap = None, -1.0
        for _ in range(epochs):
            net.train()
            order = torch.randperm(len(yt))
            for k in range(0, len(yt), 128):
                ix = order[k:k + 128]
                loss = torch.nn.functional.binary_cross_entropy_with_logits(net(Z[ix]).squeeze(-1), yt[ix], reduction="none")
                opt.zero_grad()
                (loss * sw[ix]).mean().backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                ap = _calib_ap(net(Zc).squeeze(-1).numpy(), yc)
            if ap > best_ap:
                best_ap, best = ap, [t.detach().clone() for t in (lin_in.weight, lin_in.bias, lin_out.weight, lin_out.bias)]
        assert best is not None
        w_in, b_in, w_out, b_out = (t.double().numpy() for t in best)
        W1.append((w_in / sd).T)
        b1.append(b_in - (w_in * (mu / sd)).sum(1))
        w2.append(w_out[0] / seeds)
        b2.append(float(b_out[0]) / seeds)
        aps.append(best_ap)
    hp = HiddenProbe(np.concatenate(W1, 1), np.concatenate(b1), np.concatenate(w2), float(sum(b2)),
                     {"fit": "one hidden layer of ReLU units on the mean residual, seeds averaged", "units": units,
                      "seeds": seeds, "epochs": epochs, "dropout": HIDDEN_DROPOUT,
                      "weight_decay": HIDDEN_WEIGHT_DECAY, "calib_average_precision_per_seed": aps})
    if not linear:
        return hp
    # the line carries over to requests unlike its fitting ones differently from the hidden layer; the sum keeps
    # what each gets right where the other is unsure
    lp = fit_probe(X, y, Xc, yc)
    neg = yc == 0
    lam = added_weight(hp.pooled(Xc[neg]), lp.pooled(Xc[neg])) if neg.sum() > 1 else 0.0
    return replace(hp, b2=hp.b2 + lam * lp.b, lin=lam * np.asarray(lp.w, dtype=np.float64),
                   info={**hp.info, "fit": hp.info["fit"] + ", plus a spread-weighted logistic line",
                         "linear": {"C": lp.C, "weight": lam, "calib_average_precision": _calib_ap(lp.pooled(Xc), yc)}})


# ------------------------------------------------------------------------------------------------
# one rung's numbers

def added_weight(readout_benign: np.ndarray, probe_benign: np.ndarray) -> float:
    """The weight of a probe added to a read-out's score: the ratio of their spreads over benign traffic, so that
    neither dominates the sum by scale alone (the rule :mod:`guard.recipe.prompt_probe` serves)."""
    sd = float(np.std(probe_benign))
    return float(np.std(readout_benign)) / sd if sd > 0 else 0.0


def rung_numbers(cal_scores: np.ndarray, cal_benign: np.ndarray, tst_scores: np.ndarray, tst: Sequence[Sample],
                 tst_benign: np.ndarray, budget: float, groups: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Threshold at the budget on the calibration split's benign traffic; AP and recall on the test split,
    and the share flagged of each group (a boolean mask over ``tst``).
    Samples a rung did not score (NaN) are left out on both sides."""
    cal_scores, tst_scores = np.asarray(cal_scores, dtype=float), np.asarray(tst_scores, dtype=float)
    cm, tm = np.isfinite(cal_scores), np.isfinite(tst_scores)
    thr = C.threshold_at_budget(cal_scores[cal_benign & cm], budget)
    y = np.array([s.label for s in tst], dtype=int)[tm]
    op = C.operating_point(tst_scores[tm], y, thr, np.asarray(tst_benign)[tm])
    out = {"average_precision": C.average_precision(tst_scores[tm], y), "recall_at_budget": op["recall"],
           "benign_traffic_flagged": op["flagged_benign_traffic"], "flagged_safe": op["flagged_safe"],
           "f1": op["f1"], "threshold": thr, "n_test": int(tm.sum())}
    if groups:
        by: dict[str, Any] = {}
        for name, mask in groups.items():
            m = np.asarray(mask, dtype=bool) & tm
            if m.any():
                by[name] = {"n": int(m.sum()), "flagged": flagged(tst_scores[m], thr)}
        out["flagged_by_group"] = by
    return out


def share(flags: np.ndarray) -> float:
    """The share of ``flags`` set (0 for none)."""
    return float(np.mean(flags)) if len(flags) else 0.0


def flagged(scores: np.ndarray, thr: float) -> float:
    return share(np.asarray(scores) > thr)


# ------------------------------------------------------------------------------------------------
# the ladder

@dataclass
class PromptViews:
    """The further texts the served prompt gate scores beside a conversation (:func:`guard.text.prompt_views`:
    each user message alone, the messages joined, a prefill) for the build's prompt samples, in a residual cache
    of their own. The served gate refuses where the conversation or any view crosses its threshold."""

    cache: Any
    of_sample: dict[int, list[int]]                # index in ``every`` -> its views' rows in ``cache``
    encode: Callable[[int, list[int]], Any]        # (layer, view rows) -> TokenData

    def rows(self, idx: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """The view rows of ``idx``'s samples, and for each the position in ``idx`` of the sample it views."""
        rows: list[int] = []
        owner: list[int] = []
        for k, i in enumerate(idx):
            for j in self.of_sample.get(i, ()):
                rows.append(j)
                owner.append(k)
        return rows, np.array(owner, dtype=np.int64)


def max_over_views(scores: np.ndarray, view_scores: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Each sample's score, or the highest of its views' where that is higher (the served refusal rule)."""
    out = np.array(scores, dtype=float, copy=True)
    if len(owner):
        np.maximum.at(out, owner, np.asarray(view_scores, dtype=float))
    return out


@dataclass
class LadderInputs:
    """What the ladder reads: the build's samples in cache order, the cache, the candidate SAEs, the
    encoded SAE activations per (split, gate, layer), and how to fit the shipped read-out on a layer."""

    every: list[Sample]
    split_idx: dict[str, list[int]]               # split -> cache indices
    cache: Any
    saes: dict[int, Any]
    encode: Callable[[int, list[int]], Any]        # (layer, cache indices) -> TokenData
    shipped_layer: int
    shipped: dict[str, Any]                        # gate -> (Head, Pooling) of the shipped read-out
    shipped_reference: dict[str, Any]              # gate -> Head of the paper's rule as shipped
    # (gate, select encodings, select samples, calibration encodings, calibration samples, layer: None = the
    # shipped one) -> (read-out, pooling, paper's rule), fitted as the build fits them
    fit_readout: Callable[..., tuple[Any, Any, Any]]
    budgets: dict[str, float]
    is_benign_traffic: Callable[[Sample], bool]
    posthoc: Callable[[list[Sample]], np.ndarray] | None = None
    keywords: Callable[[Sample], float] | None = None
    # prompt sets outside the build (fresh, everyday): their own small cache and encoder
    extra: dict[str, list[Sample]] | None = None
    extra_cache: Any = None
    encode_extra: Callable[[int, list[int]], Any] | None = None
    # the evaluation groups a test sample belongs to (each rung reports the share it flags of each)
    groups: Callable[[Sample], Sequence[str]] | None = None
    # the served prompt gate's views of the build's prompt samples (leave-one-source-out scores with them too)
    views: PromptViews | None = None
    # layer -> the build's generated prompts as mean residuals and labels (fitting part, calibration part): the
    # served prompt probe is fitted with them, and so is leave-one-source-out's
    generated_residuals: Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = None
    # the response gate as served, refitted on a leave-out fold: (select indices, calibration indices, the fold's
    # read-out, its pooling[, a prompt read-out for the context term to read instead of the served one]) -> a
    # function of cache indices that says which answers the gate cuts. The build adds a context term and a residual
    # probe to the read-out; without them a leave-out measures a rung, not the gate
    response_as_served: Callable[..., Callable[[list[int]], np.ndarray]] | None = None
    # the units per seed of the served prompt probe's hidden layer (0: a logistic regression), which the prompt
    # gate's leave-outs fit as the build does
    prompt_probe_hidden: int = 0
    prompt_probe_linear: bool = False


def run_ladder(inp: LadderInputs, layers: Sequence[int]) -> dict[str, Any]:
    """Per candidate layer and gate, every rung's AP and recall at the budget on the test split; for the
    extra prompt sets, the share each rung flags at that same threshold."""
    from guard.recipe.selection import head_sample_scores

    out: dict[str, Any] = {"layers": {}, "layer_free": {}, "extra_flagged": {}}
    ev = inp.every
    t0 = time.time()
    for gate in GATES:
        sel = [i for i in inp.split_idx["select"] if ev[i].gate == gate]
        cal = [i for i in inp.split_idx["calib"] if ev[i].gate == gate]
        tst = [i for i in inp.split_idx["test"] if ev[i].gate == gate]
        s_sel, s_cal, s_tst = ([ev[i] for i in part] for part in (sel, cal, tst))
        y_sel = np.array([s.label for s in s_sel])
        y_cal = np.array([s.label for s in s_cal])
        bt_cal = np.array([inp.is_benign_traffic(s) for s in s_cal])
        bt_tst = np.array([inp.is_benign_traffic(s) for s in s_tst])
        budget = inp.budgets[gate]
        g_tst = group_masks(s_tst, inp.groups)
        ex_sets = (inp.extra or {}) if gate == "prompt" else {}
        ex_idx: dict[str, list[int]] = {}
        ex_samples: list[Sample] = []
        for set_name, ss in ex_sets.items():
            ex_idx[set_name] = list(range(len(ex_samples), len(ex_samples) + len(ss)))
            ex_samples += ss
        ex_all = [i for v in ex_idx.values() for i in v]
        extra_cache = inp.extra_cache

        def numbers(sc_cal: np.ndarray, sc_tst: np.ndarray, sc_ex: np.ndarray | None, name: str,
                    bucket: dict[str, Any], ex_key: str, budget: float = budget, bt_cal: np.ndarray = bt_cal,
                    s_tst: list[Sample] = s_tst, bt_tst: np.ndarray = bt_tst, ex_idx: dict[str, list[int]] = ex_idx,
                    g_tst: dict[str, np.ndarray] = g_tst) -> None:
            r = rung_numbers(sc_cal, bt_cal, sc_tst, s_tst, bt_tst, budget, g_tst)
            bucket[name] = r
            if sc_ex is not None:
                k = 0
                for set_name, ids in ex_idx.items():
                    out["extra_flagged"].setdefault(ex_key, {}).setdefault(name, {})[set_name] = flagged(
                        sc_ex[k:k + len(ids)], r["threshold"])
                    k += len(ids)

        lf = out["layer_free"].setdefault(gate, {})
        if inp.posthoc is not None:
            ph_ex = inp.posthoc(ex_samples) if ex_all else None
            numbers(inp.posthoc(s_cal), inp.posthoc(s_tst), ph_ex, "posthoc_verdict", lf, "layer_free")
        if inp.keywords is not None:
            kw = inp.keywords
            kw_ex = np.array([kw(x) for x in ex_samples]) if ex_all else None
            numbers(np.array([kw(s) for s in s_cal]), np.array([kw(s) for s in s_tst]), kw_ex, "keywords", lf,
                    "layer_free")
        for layer in layers:
            lrep = out["layers"].setdefault(str(layer), {}).setdefault(gate, {})
            ex_key = f"L{layer}"
            head: Any
            pooling: Any
            td = {k: inp.encode(layer, v) for k, v in (("select", sel), ("calib", cal), ("test", tst))}
            td_ex = inp.encode_extra(layer, ex_all) if ex_all and inp.encode_extra is not None else None
            if layer == inp.shipped_layer:
                head, pooling = inp.shipped[gate]
                ref = inp.shipped_reference[gate]
            else:
                head, pooling, ref = inp.fit_readout(gate, td["select"], s_sel, td["calib"], s_cal, layer)
            # 2-3: dense probe on the residual
            Xs, _ = residual_features(inp.cache, layer, sel)
            Xc, spans_c = residual_features(inp.cache, layer, cal)
            Xt, spans_t = residual_features(inp.cache, layer, tst)
            p = fit_probe(Xs, y_sel, Xc, y_cal)
            Xe, spans_e = residual_features(extra_cache, layer, ex_all) if ex_all else (None, None)
            dense = (p.pooled(Xc), p.pooled(Xt), p.pooled(Xe) if Xe is not None else None)
            numbers(*dense, "dense_pooled", lrep, ex_key)
            numbers(p.streamed_dense(spans_c, pooling), p.streamed_dense(spans_t, pooling),
                    p.streamed_dense(spans_e, pooling) if spans_e is not None else None, "dense_streamed", lrep, ex_key)
            lrep["dense_pooled"]["C"] = p.C
            del spans_c, spans_t
            # 4: all SAE latents
            q = fit_probe(sae_pooled(td["select"]), y_sel, sae_pooled(td["calib"]), y_cal)
            numbers(q.pooled(sae_pooled(td["calib"])), q.pooled(sae_pooled(td["test"])),
                    q.pooled(sae_pooled(td_ex)) if td_ex is not None else None, "sae_all_pooled", lrep, ex_key)
            numbers(q.streamed_sparse(td["calib"], pooling), q.streamed_sparse(td["test"], pooling),
                    q.streamed_sparse(td_ex, pooling) if td_ex is not None else None, "sae_all_streamed", lrep, ex_key)
            lrep["sae_all_pooled"]["C"] = q.C
            # 5-6: the sparse read-out and the paper's rule
            ro = (head_sample_scores(td["calib"], head, pooling), head_sample_scores(td["test"], head, pooling),
                  head_sample_scores(td_ex, head, pooling) if td_ex is not None else None)
            numbers(*ro, "sparse_readout", lrep, ex_key)
            lrep["sparse_readout"].update({"n_latents": len(head.ids), "window": pooling.window,
                                           "shipped": layer == inp.shipped_layer})
            if gate == "prompt":
                # the prompt gate as served: the read-out's score plus the weighted dense probe's (here fitted
                # on the dataset's prompts alone, without the build's generated ones)
                lam = added_weight(ro[0][bt_cal], dense[0][bt_cal])
                numbers(ro[0] + lam * dense[0], ro[1] + lam * dense[1],
                        ro[2] + lam * dense[2] if ro[2] is not None and dense[2] is not None else None,
                        "readout_plus_dense", lrep, ex_key)
                lrep["readout_plus_dense"]["weight"] = lam
            numbers(head_sample_scores(td["calib"], ref, Pooling()), head_sample_scores(td["test"], ref, Pooling()),
                    head_sample_scores(td_ex, ref, Pooling()) if td_ex is not None else None, "paper_rule", lrep, ex_key)
            log.info("ladder L%d %s: %s (%.0fs)", layer, gate,
                     {k: round(v["average_precision"], 3) for k, v in lrep.items()}, time.time() - t0)
    out["where_signal_is_lost"] = where_lost(out)
    return out


def group_masks(samples: Sequence[Sample], groups: Callable[[Sample], Sequence[str]] | None) -> dict[str, np.ndarray]:
    """One boolean mask over ``samples`` per group name that ``groups`` gives any of them."""
    if groups is None:
        return {}
    names = [set(groups(s)) for s in samples]
    return {g: np.array([g in n for n in names], dtype=bool) for g in sorted(set().union(*names))}


RUNG_ORDER = ("dense_pooled", "dense_streamed", "sae_all_pooled", "sae_all_streamed", "sparse_readout", "paper_rule")
STEPS = (("dense_pooled", "dense_streamed", "the deployed window (pooled -> streamed)"),
         ("dense_pooled", "sae_all_pooled", "the SAE dictionary (residual -> all latents)"),
         ("sae_all_streamed", "sparse_readout", "latent selection and read-out fitting (all latents -> sparse)"))


def _group_lost(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    ga, gb = a.get("flagged_by_group", {}), b.get("flagged_by_group", {})
    return {g: ga[g]["flagged"] - gb[g]["flagged"] for g in ga if g in gb}


def where_lost(rep: dict[str, Any]) -> dict[str, Any]:
    """Per layer and gate, the AP and recall lost at each step of the ladder, largest first (with the share
    flagged that each evaluation group loses at that step)."""
    out: dict[str, Any] = {}
    for layer, gates in rep["layers"].items():
        for gate, rungs in gates.items():
            steps = []
            for a, b, what in STEPS:
                if a in rungs and b in rungs:
                    steps.append({"step": what, "from": a, "to": b,
                                  "ap_lost": rungs[a]["average_precision"] - rungs[b]["average_precision"],
                                  "recall_lost": rungs[a]["recall_at_budget"] - rungs[b]["recall_at_budget"],
                                  "flagged_lost_by_group": _group_lost(rungs[a], rungs[b])})
            ph = rep["layer_free"].get(gate, {}).get("posthoc_verdict")
            if ph is not None and "dense_pooled" in rungs:
                steps.append({"step": "reading the residual instead of the verdict", "from": "posthoc_verdict",
                              "to": "dense_pooled",
                              "ap_lost": ph["average_precision"] - rungs["dense_pooled"]["average_precision"],
                              "recall_lost": ph["recall_at_budget"] - rungs["dense_pooled"]["recall_at_budget"],
                              "flagged_lost_by_group": _group_lost(ph, rungs["dense_pooled"])})
            out[f"L{layer}/{gate}"] = sorted(steps, key=lambda s: -s["recall_lost"])
    return out


# ------------------------------------------------------------------------------------------------
# leave one source out

def source_family(source: str) -> str:
    """Sources grouped by where the text came from (one prompt generator or one published collection)."""
    parts = source.split("/")
    return "/".join(parts[:2])


def loso(inp: LadderInputs, layer: int, min_select: int = 20, families: Sequence[str] | None = None,
         probes: bool = True) -> dict[str, Any]:
    """For each family of unsafe sources with at least ``min_select`` select samples: refit the read-out (and
    the probes) without that family's unsafe samples, threshold at the budget on the calibration split's
    benign traffic, and measure recall on the family's unsafe samples in every split (none seen by the refit)
    and the test split's benign traffic flagged.

    Where the family also holds benign samples (benign twins of its unsafe requests, its own negatives), a
    second fit, ``whole_source``, leaves those out too: a source the build never saw at all. The first fit
    keeps them in the fitting and in the calibration's benign traffic, so it asks something harder: whether
    the family's unsafe requests are told from benign ones worded the same way that the refit was told are
    benign. ``whole_source`` adds the share of the family's own benign samples flagged."""
    ev = inp.every
    out: dict[str, Any] = {}
    for gate in GATES:
        sel = [i for i in inp.split_idx["select"] if ev[i].gate == gate]
        cal = [i for i in inp.split_idx["calib"] if ev[i].gate == gate]
        tst = [i for i in inp.split_idx["test"] if ev[i].gate == gate]
        fams: dict[str, int] = {}
        for i in sel:
            if ev[i].label:
                f = source_family(ev[i].source)
                fams[f] = fams.get(f, 0) + 1
        todo = sorted(f for f, n in fams.items() if n >= min_select and (families is None or f in families))
        bench = [i for i in tst if inp.is_benign_traffic(ev[i])]
        for fam in todo:
            t = time.time()

            def in_family(i: int, fam: str = fam) -> bool:
                return source_family(ev[i].source) == fam

            def held(i: int) -> bool:
                return bool(ev[i].label) and in_family(i)

            target = [i for i in sel + cal + tst if held(i)]
            r = _loso_fit(inp, layer, gate, [i for i in sel if not held(i)], [i for i in cal if not held(i)],
                          target, bench, probes)
            r = {"n_held_out": len(target), "n_select_removed": sum(1 for i in sel if held(i)), **r}
            own_benign = [i for i in sel + cal + tst if in_family(i) and not ev[i].label]
            if own_benign:
                w = _loso_fit(inp, layer, gate, [i for i in sel if not in_family(i)],
                              [i for i in cal if not in_family(i)], target,
                              [i for i in bench if not in_family(i)], probes, own_benign)
                r["whole_source"] = {"n_select_removed": sum(1 for i in sel if in_family(i)),
                                     "n_family_benign": len(own_benign), **w}
            r["seconds"] = time.time() - t
            out[f"{gate}/{fam}"] = r
            log.info("leave-one-source-out %s/%s: %s", gate, fam, json.dumps(r))
    return out


def _fit_gate_probe(inp: LadderInputs, layer: int, gate: str, Xs: np.ndarray, y_sel: np.ndarray, Xc: np.ndarray,
                    y_cal: np.ndarray) -> LinearProbe | HiddenProbe:
    """A gate's dense probe on a fold's mean residuals, fitted as the build fits it: the prompt gate's together
    with the build's generated prompts, and with the build's hidden layer where it has one."""
    if gate == "prompt" and inp.generated_residuals is not None:
        gs, gys, gc, gyc = inp.generated_residuals(layer)
        Xs, y_sel, Xc, y_cal = np.vstack([Xs, gs]), np.concatenate([y_sel, gys]), np.vstack([Xc, gc]), np.concatenate([y_cal, gyc])
    if gate == "prompt" and inp.prompt_probe_hidden:
        return fit_hidden_probe(Xs, y_sel, Xc, y_cal, inp.prompt_probe_hidden, linear=inp.prompt_probe_linear)
    return fit_probe(Xs, y_sel, Xc, y_cal)


def _loso_fit(inp: LadderInputs, layer: int, gate: str, sel_k: list[int], cal_k: list[int], target: list[int],
              bench: list[int], probes: bool, own_benign: list[int] | None = None) -> dict[str, Any]:
    """One leave-out fit on ``sel_k`` / ``cal_k``: each rung's recall on ``target``, benign traffic flagged on
    ``bench`` at the budget and the balanced accuracy of the two (and, given ``own_benign``, the share of those
    flagged, ``family_benign_flagged``, and the balanced accuracy against them); for the response gate, also the
    gate as served (``as_served``: the fold's read-out with its own context term and residual probe)."""
    from guard.recipe.selection import head_sample_scores

    ev = inp.every
    extra = own_benign or []
    s_sel, s_cal = [ev[i] for i in sel_k], [ev[i] for i in cal_k]
    bt_cal = np.array([inp.is_benign_traffic(s) for s in s_cal])
    td_sel, td_cal = inp.encode(layer, sel_k), inp.encode(layer, cal_k)
    td_tgt, td_ben = inp.encode(layer, target), inp.encode(layer, bench + extra)
    nb = len(bench)
    head, pooling, _ = inp.fit_readout(gate, td_sel, s_sel, td_cal, s_cal)
    r: dict[str, Any] = {}

    def rates(f_tgt: np.ndarray, f_ben: np.ndarray) -> dict[str, float]:
        got = {"recall": share(f_tgt), "benign_traffic_flagged": share(f_ben[:nb])}
        # the target is a balanced accuracy: the held-out unsafe samples against the benign traffic, and, for a
        # source left out whole, against its own benign samples, which the refit never saw either
        got["balanced_accuracy"] = 0.5 * (got["recall"] + 1.0 - got["benign_traffic_flagged"])
        if extra:
            got["family_benign_flagged"] = share(f_ben[nb:])
            got["balanced_accuracy_own_benign"] = 0.5 * (got["recall"] + 1.0 - got["family_benign_flagged"])
        return got

    def at_budget(sc_cal: np.ndarray, sc_tgt: np.ndarray, sc_ben: np.ndarray) -> dict[str, float]:
        thr = C.threshold_at_budget(sc_cal[bt_cal], inp.budgets[gate])
        return rates(np.asarray(sc_tgt) > thr, np.asarray(sc_ben) > thr)

    ro_c, ro_g, ro_b = (np.asarray(head_sample_scores(td, head, pooling)) for td in (td_cal, td_tgt, td_ben))
    r["sparse_readout"] = at_budget(ro_c, ro_g, ro_b)
    lam = 0.0
    if probes:
        y_sel = np.array([s.label for s in s_sel])
        y_cal = np.array([s.label for s in s_cal])
        Xs, _ = residual_features(inp.cache, layer, sel_k)
        Xc, _ = residual_features(inp.cache, layer, cal_k)
        Xg, _ = residual_features(inp.cache, layer, target)
        Xb, _ = residual_features(inp.cache, layer, bench + extra)
        p = _fit_gate_probe(inp, layer, gate, Xs, y_sel, Xc, y_cal)
        pc, pg, pb = p.pooled(Xc), p.pooled(Xg), p.pooled(Xb)
        r["dense_pooled"] = at_budget(pc, pg, pb)
        if gate == "prompt":
            # the prompt gate's sum, both parts fitted without the family
            lam = added_weight(ro_c[bt_cal], pc[bt_cal])
            r["readout_plus_dense"] = at_budget(ro_c + lam * pc, ro_g + lam * pg, ro_b + lam * pb)
        q = fit_probe(sae_pooled(td_sel), y_sel, sae_pooled(td_cal), y_cal)
        r["sae_all_pooled"] = at_budget(q.pooled(sae_pooled(td_cal)), q.pooled(sae_pooled(td_tgt)),
                                        q.pooled(sae_pooled(td_ben)))
    if gate == "prompt" and inp.views is not None:
        # as served: the held-out family's requests and the benign traffic refused where the conversation
        # or any of its views crosses the threshold set on the conversations (as the build sets it)
        vw = inp.views
        (g_rows, g_own), (b_rows, b_own) = vw.rows(target), vw.rows(bench + extra)
        rows, ng = g_rows + b_rows, len(g_rows)
        ro_v = np.asarray(head_sample_scores(vw.encode(layer, rows), head, pooling)) if rows else np.zeros(0)
        rv: dict[str, Any] = {"sparse_readout": at_budget(ro_c, max_over_views(ro_g, ro_v[:ng], g_own),
                                                          max_over_views(ro_b, ro_v[ng:], b_own))}
        if probes:
            pv = np.asarray(p.pooled(residual_features(vw.cache, layer, rows)[0])) if rows else np.zeros(0)
            rv["dense_pooled"] = at_budget(pc, max_over_views(pg, pv[:ng], g_own), max_over_views(pb, pv[ng:], b_own))
            sv = ro_v + lam * pv
            rv["readout_plus_dense"] = at_budget(ro_c + lam * pc, max_over_views(ro_g + lam * pg, sv[:ng], g_own),
                                                 max_over_views(ro_b + lam * pb, sv[ng:], b_own))
        rv["n_held_out_with_views"] = len(set(g_own.tolist()))
        r["with_views"] = rv
    if gate == "response" and inp.response_as_served is not None:
        cut = inp.response_as_served(sel_k, cal_k, head, pooling)
        r["as_served"] = rates(cut(target), cut(bench + extra))
    return r


# ------------------------------------------------------------------------------------------------
# end to end: both gates, as a conversation meets them

def request_index(every: Sequence[Sample], is_benign_traffic: Callable[[Sample], bool]) -> dict[int, int]:
    """Each answer's request among the prompt samples (answer index -> prompt index): the prompt sample with the
    same conversation, else one of the answer's group with the same last user message (a request the generator
    sent with a system message, or the last turn of a conversation), else one of its group labelled benign where
    the answer is benign traffic and unsafe where it is not. Answers with none are left out. Splits are drawn by
    group, so a link never crosses them."""
    by_conv: dict[str, list[int]] = {}
    by_group: dict[str, list[int]] = {}
    for i, s in enumerate(every):
        if s.gate == "prompt":
            by_conv.setdefault(json.dumps(s.conv), []).append(i)
            by_group.setdefault(s.group, []).append(i)
    out: dict[int, int] = {}
    for i, s in enumerate(every):
        if s.gate != "response":
            continue
        group = by_group.get(s.group, []) if s.group else []
        found = (by_conv.get(json.dumps(s.conv)) or [j for j in group if every[j].prompt == s.prompt]
                 or [j for j in group if every[j].label == (0 if is_benign_traffic(s) else 1)])
        if found:
            out[i] = found[0]
    return out


def unsafe_answers(every: Sequence[Sample], idx: Sequence[int], req: Mapping[int, int]) -> list[int]:
    """The answers of ``idx`` that are unsafe and answer an unsafe request (a drift stream answers a benign one)."""
    return [i for i in idx if every[i].label and i in req and every[req[i]].label]


def end_to_end_numbers(unsafe: Sequence[int], benign: Sequence[int], refused: Callable[[list[int]], np.ndarray],
                       cut: Callable[[list[int]], np.ndarray], req: Mapping[int, int]) -> dict[str, Any]:
    """The two numbers a gateway is judged by: of the ``unsafe`` answers, the share stopped (the request refused
    by the prompt gate, or the answer cut by the response gate), and of the ``benign`` ones, the share lost to
    either. ``refused(prompt indices)`` and ``cut(answer indices)`` say what each gate does; ``req`` links an
    answer to its request (:func:`request_index`); an answer whose request is not linked counts as one the
    prompt gate let through."""
    out: dict[str, Any] = {}
    for side, idx in (("unsafe", list(unsafe)), ("benign", list(benign))):
        linked = [k for k, i in enumerate(idx) if i in req]
        ref = np.zeros(len(idx), dtype=bool)
        if linked:
            ref[linked] = refused([req[idx[k]] for k in linked])
        c = np.asarray(cut(idx), dtype=bool) if idx else np.zeros(0, dtype=bool)
        out[side] = {"n": len(idx), "n_request_linked": len(linked), "request_refused": share(ref),
                     "answer_cut": share(c), "either": share(ref | c)}
    out["unsafe_stopped"] = out["unsafe"]["either"]
    out["benign_lost"] = out["benign"]["either"]
    out["balanced_accuracy"] = 0.5 * (out["unsafe_stopped"] + 1.0 - out["benign_lost"])
    return out


def _served_prompt_fold(inp: LadderInputs, layer: int, sel_k: list[int],
                        cal_k: list[int]) -> tuple[Any, Callable[[list[int]], np.ndarray]]:
    """The prompt gate as served, refitted on ``sel_k`` / ``cal_k``: the read-out plus the dense probe at its
    added weight, thresholded at the budget on the calibration split's benign traffic, refusing where the
    conversation or any of its views crosses. Returns the read-out and which prompt samples it refuses."""
    from guard.recipe.selection import head_sample_scores

    ev = inp.every
    s_sel, s_cal = [ev[i] for i in sel_k], [ev[i] for i in cal_k]
    td_sel, td_cal = inp.encode(layer, sel_k), inp.encode(layer, cal_k)
    head, pooling, _ = inp.fit_readout("prompt", td_sel, s_sel, td_cal, s_cal)
    y_sel, y_cal = np.array([s.label for s in s_sel]), np.array([s.label for s in s_cal])
    Xs, Xc = residual_features(inp.cache, layer, sel_k)[0], residual_features(inp.cache, layer, cal_k)[0]
    p = _fit_gate_probe(inp, layer, "prompt", Xs, y_sel, Xc, y_cal)
    bt = np.array([inp.is_benign_traffic(s) for s in s_cal])
    ro_c, pc = np.asarray(head_sample_scores(td_cal, head, pooling)), p.pooled(Xc)
    lam = added_weight(ro_c[bt], pc[bt])
    thr = C.threshold_at_budget((ro_c + lam * pc)[bt], inp.budgets["prompt"])

    def refused(idx: list[int]) -> np.ndarray:
        uniq = sorted(set(idx))
        sc = np.asarray(head_sample_scores(inp.encode(layer, uniq), head, pooling)) \
            + lam * p.pooled(residual_features(inp.cache, layer, uniq)[0])
        if inp.views is not None:
            rows, owner = inp.views.rows(uniq)
            if rows:
                vs = np.asarray(head_sample_scores(inp.views.encode(layer, rows), head, pooling)) \
                    + lam * p.pooled(residual_features(inp.views.cache, layer, rows)[0])
                sc = max_over_views(sc, vs, owner)
        at = {i: k for k, i in enumerate(uniq)}
        return np.array([sc[at[i]] > thr for i in idx], dtype=bool)
    return head, refused


def loso_end_to_end(inp: LadderInputs, layer: int, families: Sequence[str] | None = None,
                    min_held: int = 20) -> dict[str, Any]:
    """Leave one source out, end to end. For each family F of unsafe prompt sources with at least ``min_held``
    unsafe answers whose request is F's (:func:`request_index`): the prompt gate refitted as served without F's
    unsafe requests (:func:`_served_prompt_fold`), and the response gate refitted as served without the unsafe
    answers to them, its context term reading the refitted prompt read-out; then the share of those answers, in
    every split, that either gate stops, and the share of the test split's benign traffic that either loses
    (:func:`end_to_end_numbers`). ``nothing_left_out``: the same fits on everything, over the test split's
    unsafe answers, for scale."""
    if inp.response_as_served is None:
        raise ValueError("end to end needs the response gate as served (LadderInputs.response_as_served)")
    ev = inp.every
    req = request_index(ev, inp.is_benign_traffic)

    def part(split: str, gate: str) -> list[int]:
        return [i for i in inp.split_idx[split] if ev[i].gate == gate]

    sel_p, cal_p = part("select", "prompt"), part("calib", "prompt")
    sel_r, cal_r, tst_r = part("select", "response"), part("calib", "response"), part("test", "response")
    bench = [i for i in tst_r if inp.is_benign_traffic(ev[i])]
    by_fam: dict[str, list[int]] = {}
    for i in unsafe_answers(ev, sel_r + cal_r + tst_r, req):
        by_fam.setdefault(source_family(ev[req[i]].source), []).append(i)
    todo = sorted(f for f, v in by_fam.items() if len(v) >= min_held and (families is None or f in families))
    out: dict[str, Any] = {}
    for fam in [None, *todo]:
        t = time.time()
        held = set(by_fam[fam]) if fam is not None else set()

        def kept_prompt(i: int, fam: str | None = fam) -> bool:
            return not (fam is not None and ev[i].label and source_family(ev[i].source) == fam)

        head, refused = _served_prompt_fold(inp, layer, [i for i in sel_p if kept_prompt(i)],
                                            [i for i in cal_p if kept_prompt(i)])
        sel_k, cal_k = [i for i in sel_r if i not in held], [i for i in cal_r if i not in held]
        r_head, r_pool, _ = inp.fit_readout("response", inp.encode(layer, sel_k), [ev[i] for i in sel_k],
                                            inp.encode(layer, cal_k), [ev[i] for i in cal_k])
        cut = inp.response_as_served(sel_k, cal_k, r_head, r_pool, head)
        target = sorted(held) if fam is not None else unsafe_answers(ev, tst_r, req)
        r = end_to_end_numbers(target, bench, refused, cut, req)
        r["seconds"] = time.time() - t
        out[fam or "nothing_left_out"] = r
        log.info("end to end, leaving out %s: %s", fam or "nothing", json.dumps(r))
    return out


def mean_pair_accuracy(fresh: Mapping[str, float]) -> float | None:
    """The mean balanced accuracy over the fresh harmful/edgy pairs in ``fresh`` (:func:`fresh_prompt_numbers`)."""
    bas = [v for k, v in fresh.items() if k.startswith("balanced_accuracy") and "_vs_edgy" in k]
    return float(np.mean(bas)) if bas else None


def probe_by_depth(features: Callable[[str, int], np.ndarray], labels: Mapping[str, np.ndarray],
                   threshold_at: Callable[[np.ndarray], float], extra: Sequence[str], depths: Sequence[int],
                   curve_layer: int | None = None, fractions: Sequence[float] = (0.25, 0.5, 0.75), draws: int = 2,
                   seed: int = 0) -> dict[str, Any]:
    """The prompt gate's dense probe (:func:`fit_probe` on each request's mean residual) at each depth of the
    safeguard, not only the layers an SAE was trained at: how much of the signal any linear read of the residual
    holds, which bounds every read-out below it. ``features(part, layer)``: the mean residuals of ``part``
    ("select", "calib", "test" or a name in ``extra``); ``labels[part]``; ``threshold_at(calibration scores)``:
    the budget's threshold. With ``curve_layer``, also a learning curve there: the probe refitted on random
    ``fractions`` of the select split (``draws`` each), to tell whether more of the same data would still help."""
    rng = np.random.default_rng(seed)

    def numbers(p: LinearProbe, layer: int) -> dict[str, Any]:
        sc_cal = p.pooled(features("calib", layer))
        thr = threshold_at(sc_cal)
        out: dict[str, Any] = {"C": p.C, "threshold": float(thr),
                               "calib_average_precision": C.average_precision(sc_cal, labels["calib"])}
        for part, sc in (("calib", sc_cal), ("test", p.pooled(features("test", layer)))):
            f, y = sc > thr, labels[part] == 1
            out[f"{part}_balanced_accuracy"] = 0.5 * (float(f[y].mean()) + 1.0 - float(f[~y].mean()))
        flags = {name: flagged(p.pooled(features(name, layer)), thr) for name in extra}
        out["flagged"] = flags
        out["fresh"] = fresh_prompt_numbers(flags)
        out["mean_pair_balanced_accuracy"] = mean_pair_accuracy(out["fresh"])
        return out

    rep: dict[str, Any] = {"depths": {}}
    for layer in depths:
        rep["depths"][str(layer)] = numbers(
            fit_probe(features("select", layer), labels["select"], features("calib", layer), labels["calib"]), layer)
        log.info("probe at depth %d: mean pair balanced accuracy %s", layer, rep["depths"][str(layer)]["mean_pair_balanced_accuracy"])
    if curve_layer is not None:
        X, y = features("select", curve_layer), labels["select"]
        curve = []
        for frac in fractions:
            for draw in range(draws):
                keep = rng.random(len(y)) < frac
                r = numbers(fit_probe(X[keep], y[keep], features("calib", curve_layer), labels["calib"]), curve_layer)
                curve.append({"fraction": frac, "draw": draw, "n_select": int(keep.sum()), **r})
        rep["learning_curve"] = {"layer": curve_layer, "points": curve}
    return rep


def fresh_prompt_numbers(flags: dict[str, float]) -> dict[str, float]:
    """The prompt-gate targets on the freshly written sets: recall on direct harmful requests (both sets),
    edgy-but-benign and everyday prompts refused, and the balanced accuracy of harmful vs benign prompts."""
    h = flags.get("fresh_harmful")
    e = flags.get("fresh_benign_edgy")
    d = flags.get("everyday")
    out = {k: v for k, v in (("harmful_refused", h), ("edgy_benign_refused", e), ("everyday_refused", d)) if v is not None}
    if h is not None and e is not None:
        out["balanced_accuracy_vs_edgy"] = 0.5 * (h + 1.0 - e)
    if h is not None and d is not None:
        out["balanced_accuracy_vs_everyday"] = 0.5 * (h + 1.0 - d)
    # the second harmful set, written after a recipe change made while watching the first
    if (hb := flags.get("fresh_harmful_b")) is not None:
        out["harmful_b_refused"] = hb
        if e is not None:
            out["balanced_accuracy_b_vs_edgy"] = 0.5 * (hb + 1.0 - e)
    # the later pairs, each written before a change it checks, the n-th harmful set with the (n-1)-th edgy set
    # (fresh_harmful_c with fresh_benign_edgy_b, d with c, ...): the third harmful and second edgy set after the
    # prompt gate's residual probe was chosen while watching the sets above; the fourth and third before any
    # change aimed at the refusals of the second edgy set (which had been read request by request); the fifth and
    # fourth before any change made after the third edgy set's refusals had been read; the sixth and fifth after
    # the fifth and fourth had been used to choose between two builds; the seventh and sixth after the sixth and
    # fifth had been scored on two builds; the eighth and seventh after the seventh and sixth had been scored once
    # on the served build; the ninth and eighth after the eighth and seventh had been scored once on two builds (the
    # served build and a candidate, which was then served), before the next change to the prompt gate
    letters = sorted({k[-1] for k in flags if re.fullmatch(r"fresh_harmful_[c-z]", k)}
                     | {chr(ord(k[-1]) + 1) for k in flags if re.fullmatch(r"fresh_benign_edgy_[b-y]", k)})
    for hl in letters:
        el = chr(ord(hl) - 1)
        hx, ex = flags.get(f"fresh_harmful_{hl}"), flags.get(f"fresh_benign_edgy_{el}")
        if hx is not None:
            out[f"harmful_{hl}_refused"] = hx
        if ex is not None:
            out[f"edgy_benign_{el}_refused"] = ex
        if hx is not None and ex is not None:
            out[f"balanced_accuracy_{hl}_vs_edgy_{el}"] = 0.5 * (hx + 1.0 - ex)
    return out


def write_report(path: Path, rep: dict[str, Any]) -> None:
    path.write_text(json.dumps(rep, indent=1, default=str))
