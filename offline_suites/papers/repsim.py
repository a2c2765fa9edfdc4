"""repsim: "Causes and consequences of representational similarity" (Li, Vu, Awofisayo, Wenger;
arXiv 2505.13899; code lizeyu090312/ReprSimCauses — reimplemented from the description, no code copied).

Track V (worker-trained): MLPs on sklearn digits trained on controlled *dataset overlaps* (the
repo's constrained split: model A's data is fixed, model B shares round(f·N) examples per class),
compared with the paper's metric set (mutual-kNN with k = 10, linear CKA, CKNNA, SVCCA) on held-out
penultimate features and, out of distribution, on the same digits rotated a quarter turn, plus
MI-FGSM transfer attacks from A to B. The paper's findings (more overlap → more similar representations →
better transfer) are claims with verdicts; the hard checks gate what must hold of the suite's own
output: the splits, the metrics' invariances, trained models that beat chance by far, and an attack
that fools the model it was computed on. The null method leaves every MLP untrained.

Track L is a guard diagnostic, not part of the paper: per-layer similarity of the served model
(loaded from the inference layer's HF folder) to the safeguard model (the same base with the
guard's LoRA adapter merged, when an adapter is configured) and to a randomly initialised control.
It reports, and never gates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from offline_suites.base import (
    Check,
    Claim,
    Method,
    RunContext,
    SuiteResult,
    check_close,
    check_cmp,
    check_equal,
    claim,
    leave_untrained,
    method_impl,
    set_threads,
    train_for,
)
from offline_suites.registry import register_suite


@dataclass(frozen=True)
class Config:
    overlaps: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    seeds: int = 2
    holdout: int = 500
    epochs: int = 30
    batch: int = 64
    lr: float = 1e-3
    knn_k: int = 10
    attack_eps: float = 0.1          # L∞ on the [0, 1] pixel scale
    attack_steps: int = 10
    task_overlap: bool = False       # the vertical split (5 classes per model)
    llm_texts: int = 32              # Track L sentences (0 = skip Track L)
    llm_knn_k: int = 5
    safeguard_adapter: str = ""      # LoRA folder of the guard's safeguard model ("" = none configured)
    guard_layer: int = 15            # the layer the guard reads (guard BuildConfig.layer)
    min_accuracy: float = 0.8        # every trained MLP must reach this held-out accuracy (chance: 0.1)
    min_white_box_asr: float = 0.25  # MI-FGSM must fool model A on at least this share of its correct inputs
    method: str = "trained"          # a name in METHODS; "null" is the untrained model
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "overlaps": (0.0, 1.0), "seeds": (1, 100), "holdout": (50, 1500),   # sklearn digits has 1,797 images
        "epochs": (0, 1000), "batch": (1, 4096), "lr": (1e-6, 1.0), "knn_k": (1, 100), "attack_eps": (0.0, 1.0),
        "attack_steps": (1, 1000), "llm_texts": (0, 4096), "llm_knn_k": (1, 100), "guard_layer": (0, 1000),
        "min_accuracy": (0.0, 1.0), "min_white_box_asr": (0.0, 1.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


# Track L is a guard diagnostic, not the paper: off in SMOKE (CI), on in FULL
Config.SMOKE = Config(epochs=20, llm_texts=0)
Config.FULL = Config(run_seeds=3, seeds=10, epochs=60, task_overlap=True, llm_texts=256)


# ------------------------------------------------------------------------------------- metrics
def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean(0)
    y = y - y.mean(0)
    num = np.linalg.norm(y.T @ x) ** 2
    den = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(num / den)


def _knn(x: np.ndarray, k: int) -> np.ndarray:
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Mean |kNN_x(i) ∩ kNN_y(i)| / k over points (platonic-rep alignment)."""
    a, b = _knn(x, k), _knn(y, k)
    return float(np.mean([len(set(a[i]) & set(b[i])) / k for i in range(x.shape[0])]))


def _hsic(k: np.ndarray, m: np.ndarray) -> float:
    """Biased HSIC of two kernel matrices: tr(K H M H) / (n − 1)², computed as Σ (HKH) ⊙ (HMH)ᵀ (H
    is idempotent), O(n²) instead of the O(n³) products. The transpose matters: kNN-masked kernels
    are not symmetric."""
    def center(g: np.ndarray) -> np.ndarray:
        return g - g.mean(0, keepdims=True) - g.mean(1, keepdims=True) + g.mean()
    n = k.shape[0]
    return float(np.sum(center(k) * center(m).T) / (n - 1) ** 2)


def cknna(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """CKA restricted to mutual k-nearest-neighbour pairs (platonic-rep's CKNNA): HSIC of the linear
    kernels masked to the pairs that are neighbours in both spaces, normalised by the self terms."""
    kx, ky = x @ x.T, y @ y.T

    def masked(a: np.ndarray, b: np.ndarray) -> float:
        # neighbours by kernel value (the most similar j ≠ i), as in the reference implementation
        def nn_mask(g: np.ndarray) -> np.ndarray:
            g = g.copy()
            np.fill_diagonal(g, -np.inf)
            idx = np.argsort(-g, axis=1, kind="stable")[:, :k]
            mask = np.zeros_like(g)
            np.put_along_axis(mask, idx, 1.0, axis=1)
            return mask
        mask = nn_mask(a) * nn_mask(b)
        return _hsic(mask * a, mask * b)

    den = math.sqrt(max(masked(kx, kx) * masked(ky, ky), 0.0))
    return masked(kx, ky) / den if den > 0 else float("nan")


def svcca(x: np.ndarray, y: np.ndarray, keep: float = 0.99) -> float:
    """SVCCA: project each representation on the top singular directions that keep ``keep`` of
    its variance, then the mean canonical correlation between the two projections."""
    def reduce(z: np.ndarray) -> np.ndarray:
        z = z - z.mean(0)
        u, sv, _ = np.linalg.svd(z, full_matrices=False)
        var = np.cumsum(sv ** 2) / max(float(np.sum(sv ** 2)), 1e-300)
        r = int(np.searchsorted(var, keep) + 1)
        return u[:, :r] * sv[:r]

    a, b = reduce(x), reduce(y)
    # canonical correlations = singular values of Qa^T Qb for orthonormal bases of the two spans
    qa, _ = np.linalg.qr(a)
    qb, _ = np.linalg.qr(b)
    rho = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.mean(np.clip(rho, 0.0, 1.0)))


def l2n(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def overlap_split(labels: np.ndarray, frac: float, rng_seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Dataset ("horizontal") split: per class N = ⌊n_c/2⌋ each, round(f·N) shared; A is fixed."""
    rng = np.random.default_rng(rng_seed)
    a, b, shared = [], [], 0
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n = len(idx) // 2
        s = round(frac * n)
        a.append(idx[:n])
        b.append(np.concatenate([idx[:s], idx[n:2 * n - s]]))
        shared += s
    return np.concatenate(a), np.concatenate(b), shared


def task_split(frac: float, rng_seed: int, k: int = 10) -> tuple[list[int], list[int]]:
    """Task ("vertical") split: ⌊K/2⌋ classes each, round(f·K/2) shared."""
    rng = np.random.default_rng(rng_seed)
    perm = rng.permutation(k).tolist()
    half = k // 2
    s = round(frac * half)
    return perm[:half], perm[:s] + perm[half:2 * half - s]


# ---------------------------------------------------------------------------------- Track V
def _train_mlp(x: np.ndarray, y: np.ndarray, cfg: Config, seed: int, n_out: int = 10) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, n_out))
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    g = torch.Generator().manual_seed(seed)
    for _ in range(method_impl(cfg)(cfg.epochs)):
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), cfg.batch):
            j = perm[i:i + cfg.batch]
            loss = nn.functional.cross_entropy(net(xt[j]), yt[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


def _features(net: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return net[:4](torch.tensor(x, dtype=torch.float32)).numpy()


def _mi_fgsm(net: Any, x: np.ndarray, y: np.ndarray, cfg: Config) -> np.ndarray:
    import torch

    xt = torch.tensor(x, dtype=torch.float32)
    yt = torch.tensor(y)
    adv = xt.clone()
    g = torch.zeros_like(xt)
    step = cfg.attack_eps / cfg.attack_steps
    for _ in range(cfg.attack_steps):
        adv.requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(net(adv), yt)
        (grad,) = torch.autograd.grad(loss, adv)
        g = 1.0 * g + grad / grad.abs().mean(1, keepdim=True).clamp_min(1e-12)   # momentum 1.0
        adv = (adv.detach() + step * g.sign())
        adv = torch.min(torch.max(adv, xt - cfg.attack_eps), xt + cfg.attack_eps).clamp(0, 1)
    return adv.detach().numpy()


def _predict(net: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return net(torch.tensor(x, dtype=torch.float32)).argmax(1).numpy()


def _track_v(ctx: RunContext, cfg: Config, seed: int) -> tuple[list[Check], list[Claim], dict[str, Any]]:
    from scipy.stats import spearmanr
    from sklearn.datasets import load_digits

    d = load_digits()
    x_all = d.data.astype(np.float64) / 16.0
    y_all = d.target
    ctx.record_data("sklearn_digits", x_all.tobytes() + y_all.tobytes())
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y_all))
    test, pool = perm[: cfg.holdout], perm[cfg.holdout:]
    xt, yt, xp, yp = x_all[test], y_all[test], x_all[pool], y_all[pool]
    # out of distribution: the held-out digits turned a quarter (no model saw rotated digits); the
    # paper compares its CIFAR models on MNIST/SVHN the same way, on inputs from outside the training
    # distribution
    x_ood = np.rot90(xt.reshape(-1, 8, 8), 1, axes=(1, 2)).reshape(-1, 64).copy()
    checks: list[Check] = []
    rows = []
    white_box: list[float] = []
    acc_a: list[float] = []
    total = cfg.seeds * len(cfg.overlaps)
    done = 0
    for s in range(cfg.seeds):
        split_seed = seed * 1000 + s
        a_idx, _, _ = overlap_split(yp, 0.0, split_seed)
        net_a = _train_mlp(xp[a_idx], yp[a_idx], cfg, split_seed)
        fa = l2n(_features(net_a, xt))
        fa_ood = l2n(_features(net_a, x_ood))
        ok_a = _predict(net_a, xt) == yt
        adv = _mi_fgsm(net_a, xt, yt, cfg)
        wb = float(np.mean(_predict(net_a, adv)[ok_a] != yt[ok_a])) if ok_a.any() else 0.0
        white_box.append(wb)
        acc_a.append(float(np.mean(ok_a)))
        for f in cfg.overlaps:
            ctx.progress(0.05 + 0.55 * done / total, f"Track V seed {s} overlap {f}")
            done += 1
            a2, b_idx, shared = overlap_split(yp, f, split_seed)
            if s == 0:
                n_per = sum(len(np.flatnonzero(yp == c)) // 2 for c in range(10))
                checks.append(check_equal(f"split_sizes_f{f}", "sanity", [n_per, n_per, n_per],
                                          [len(a2), len(b_idx), len(set(b_idx.tolist()))],
                                          "|A|, |B|, distinct in B"))
                checks.append(check_equal(f"split_shared_count_f{f}", "sanity", shared,
                                          len(set(a2.tolist()) & set(b_idx.tolist()))))
                checks.append(check_equal(f"split_model_a_fixed_f{f}", "sanity", True, bool(np.array_equal(a2, a_idx)),
                                          "constrained split: A's data does not depend on f"))
            net_b = _train_mlp(xp[b_idx], yp[b_idx], cfg, split_seed + 1)
            fb = l2n(_features(net_b, xt))
            fb_ood = l2n(_features(net_b, x_ood))
            ok = ok_a & (_predict(net_b, xt) == yt)
            asr = float(np.mean(_predict(net_b, adv)[ok] != yt[ok])) if ok.any() else 0.0
            rows.append({"seed": s, "overlap": f, "mutual_knn": mutual_knn(fa, fb, cfg.knn_k), "cka": linear_cka(fa, fb),
                         "cknna": cknna(fa, fb, cfg.knn_k), "svcca": svcca(fa, fb),
                         "ood_mutual_knn": mutual_knn(fa_ood, fb_ood, cfg.knn_k), "ood_cka": linear_cka(fa_ood, fb_ood),
                         "transfer_asr": asr, "white_box_asr": wb,
                         "acc_b": float(np.mean(_predict(net_b, xt) == yt))})
    per_f = {}
    for f in cfg.overlaps:
        sel = [r for r in rows if r["overlap"] == f]
        per_f[str(f)] = {k: float(np.mean([r[k] for r in sel]))
                         for k in ("mutual_knn", "cka", "cknna", "svcca", "ood_mutual_knn", "ood_cka", "transfer_asr",
                                   "acc_b")}
    fs = [r["overlap"] for r in rows]
    rho = {k: float(spearmanr(fs, [r[k] for r in rows]).statistic)
           for k in ("mutual_knn", "cka", "cknna", "svcca", "ood_mutual_knn", "ood_cka", "transfer_asr")}
    rho_sim_transfer = float(spearmanr([r["mutual_knn"] for r in rows], [r["transfer_asr"] for r in rows]).statistic)
    # gates on the method's output: an untrained MLP sits at chance and its features are noise, so
    # nothing downstream (similarity, transfer) would mean anything
    worst_acc = min(acc_a + [r["acc_b"] for r in rows])
    checks.append(check_cmp("trained_models_beat_chance", "gate", worst_acc, ">=", cfg.min_accuracy,
                            "lowest held-out accuracy over every model A and B (chance 0.1)"))
    checks.append(check_cmp("white_box_attack_fools_model_a", "gate", min(white_box), ">=", cfg.min_white_box_asr,
                            f"lowest MI-FGSM success on A itself (ε={cfg.attack_eps}) over seeds; "
                            "transfer is measured against this"))
    # the transfer rate can only be read against the source's own rate
    checks.append(check_cmp("transfer_asr_below_white_box", "sanity",
                            max(r["transfer_asr"] - r["white_box_asr"] for r in rows), "<=", 0.0,
                            "examples crafted on A fool B at most as often as A"))
    claims = [claim("overlap_raises_mutual_knn", "more dataset overlap → more similar representations (mutual kNN)",
                    rho["mutual_knn"], ">", 0.5, "Spearman ρ of overlap f vs mutual kNN over all runs"),
              claim("overlap_raises_cka", "more dataset overlap → more similar representations (linear CKA)",
                    rho["cka"], ">", 0.5, "Spearman ρ of overlap f vs CKA over all runs"),
              claim("overlap_raises_cknna", "more dataset overlap → more similar representations (CKNNA)",
                    rho["cknna"], ">", 0.5, "Spearman ρ of overlap f vs CKNNA over all runs"),
              claim("overlap_raises_svcca", "more dataset overlap → more similar representations (SVCCA)",
                    rho["svcca"], ">", 0.5, "Spearman ρ of overlap f vs SVCCA over all runs"),
              claim("overlap_raises_ood_mutual_knn", "the overlap effect holds out of distribution (mutual kNN on "
                    "rotated digits)", rho["ood_mutual_knn"], ">", 0.5,
                    "Spearman ρ of overlap f vs mutual kNN on the held-out digits rotated 90°"),
              claim("overlap_raises_ood_cka", "the overlap effect holds out of distribution (linear CKA on rotated "
                    "digits)", rho["ood_cka"], ">", 0.5, "Spearman ρ of overlap f vs CKA on the rotated digits"),
              claim("overlap_raises_transfer_asr", "more overlap → adversarial examples crafted on A transfer better to B",
                    rho["transfer_asr"], ">", 0.3, "Spearman ρ of overlap f vs transfer ASR over all runs"),
              claim("similarity_predicts_transfer", "more similar representations → better transfer",
                    rho_sim_transfer, ">", 0.3, "Spearman ρ of mutual kNN vs transfer ASR over all runs")]
    metrics: dict[str, Any] = {"per_overlap": per_f, "spearman": rho, "spearman_mutual_knn_vs_transfer": rho_sim_transfer,
                               "runs": rows, "white_box_asr": white_box, "acc_a": acc_a}
    if cfg.task_overlap:
        metrics["task_overlap"] = _task_overlap(ctx, cfg, seed, xp, yp, xt, yt)
        t = metrics["task_overlap"]
        fmin, fmax = str(min(cfg.overlaps[1:] or cfg.overlaps)), str(max(cfg.overlaps))
        claims.append(claim("task_overlap_raises_mutual_knn", "more shared classes → more similar representations",
                            t[fmax] - t[fmin], ">", 0.0, f"mkNN(f={fmax}) − mkNN(f={fmin}) on the shared classes"))
    return checks, claims, metrics


def _task_overlap(ctx: RunContext, cfg: Config, seed: int, xp: np.ndarray, yp: np.ndarray, xt: np.ndarray,
                  yt: np.ndarray) -> dict[str, float]:
    out = {}
    for f in cfg.overlaps:
        if f == 0:
            continue            # no shared classes to evaluate on
        vals = []
        for s in range(cfg.seeds):
            ca, cb = task_split(f, seed * 7 + s)
            shared = sorted(set(ca) & set(cb))
            nets = []
            for cls_set, off in ((ca, 0), (cb, 1)):
                m = np.isin(yp, cls_set)
                remap = {c: i for i, c in enumerate(cls_set)}
                nets.append(_train_mlp(xp[m], np.array([remap[c] for c in yp[m]]), cfg, seed * 31 + s * 2 + off,
                                       n_out=len(cls_set)))
            te = np.isin(yt, shared)
            vals.append(mutual_knn(l2n(_features(nets[0], xt[te])), l2n(_features(nets[1], xt[te])), cfg.knn_k))
        out[str(f)] = float(np.mean(vals))
    return out


def _metric_unit_checks(rng: np.random.Generator, k: int) -> list[Check]:
    x = rng.normal(size=(200, 32))
    q, _ = np.linalg.qr(rng.normal(size=(32, 32)))
    n = 300
    a, b = rng.normal(size=(n, 16)), rng.normal(size=(n, 16))
    p = k / (n - 1)
    # each point's overlap is hypergeometric (k draws of n−1, k marked); mean over n points
    sd = math.sqrt(k * p * (1 - p) * (n - 1 - k) / (n - 2)) / k / math.sqrt(n)
    return [
        check_close("cka_orthogonal_invariance", "sanity", 1.0, linear_cka(x, x @ q), 1e-9),
        check_close("cka_isotropic_scale_invariance", "sanity", linear_cka(x, x @ q), linear_cka(3.7 * x, x @ q), 1e-9),
        check_close("mutual_knn_self", "sanity", 1.0, mutual_knn(x, x, k), 0.0),
        check_close("cknna_self", "sanity", 1.0, cknna(x, x, k), 1e-9),
        check_close("cknna_orthogonal_invariance", "sanity", 1.0, cknna(x, x @ q, k), 1e-9),
        check_cmp("cknna_independent_gaussians_low", "sanity", abs(cknna(a, b, k)), "<", 0.2,
                  "independent representations share few neighbours and no kernel structure"),
        # CCA is invariant to any invertible linear map, not only to rotations (keep = 1: no SVD cut,
        # which would drop different directions of the two spectra)
        check_close("svcca_invertible_map_invariance", "sanity", 1.0, svcca(x, x @ (q + 0.5 * np.eye(32)), keep=1.0),
                    1e-9),
        check_cmp("svcca_independent_gaussians_below_one", "sanity", svcca(a, b), "<", 0.5,
                  "16 + 16 independent Gaussian dimensions over 300 points"),
        check_close("mutual_knn_independent_gaussians", "sanity", p, mutual_knn(a, b, k), 5 * sd,
                    f"E = k/(n−1) = {p:.4f}; tolerance 5σ of the hypergeometric mean"),
    ]


# ---------------------------------------------------------------------------------- Track L
_SUBJ = ("The old sailor", "A young doctor", "The small robot", "My neighbour", "The committee", "A tired student",
         "The river", "An engineer", "The children", "A quiet librarian", "The city council", "Our teacher")
_VERB = ("carefully repaired", "quickly forgot", "painted", "described", "refused to sell", "measured",
         "celebrated", "carried", "studied", "explained")
_OBJ = ("the broken bicycle.", "an ancient map.", "the quarterly budget.", "a strange noise at night.",
        "the new bridge.", "their favourite song.", "a box of letters.", "the winter storm.")


def _texts(n: int, rng: np.random.Generator) -> list[str]:
    return [f"{_SUBJ[rng.integers(len(_SUBJ))]} {_VERB[rng.integers(len(_VERB))]} {_OBJ[rng.integers(len(_OBJ))]}"
            for _ in range(n)]


def _layer_means(model: Any, tok: Any, texts: list[str]) -> list[np.ndarray]:
    import torch

    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        hs = model(**enc, output_hidden_states=True).hidden_states
    m = enc["attention_mask"].unsqueeze(-1).float()
    # drop the first token: it is the attention sink whose few huge activations would dominate
    # every mean-pooled vector (and make all late layers look identical)
    m[:, 0] = 0.0
    return [((h * m).sum(1) / m.sum(1)).double().numpy() for h in hs]


def _track_l(ctx: RunContext, cfg: Config, seed: int) -> tuple[list[Check], dict[str, Any]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = ctx.model_path()
    rng = np.random.default_rng(seed)
    texts = _texts(cfg.llm_texts, rng)
    ctx.record_data("track_l_texts", "\n".join(texts))
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    served = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    hs = _layer_means(served, tok, texts)
    torch.manual_seed(seed)
    rand = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path))).eval()
    hr = _layer_means(rand, tok, texts)
    del rand
    k = cfg.llm_knn_k
    out: dict[str, Any] = {"model_path": str(path), "n_layers": len(hs) - 1,
                           "served_vs_random_init": [{"cka": linear_cka(a, b), "mutual_knn": mutual_knn(l2n(a), l2n(b), k)}
                                                     for a, b in zip(hs, hr, strict=True)]}
    g = min(cfg.guard_layer + 1, len(hs) - 1)   # hidden_states[L + 1] = residual after block L
    out["served_guard_layer_vs_all_layers_cka"] = [linear_cka(hs[g], h) for h in hs]
    checks: list[Check] = []
    adapter = Path(cfg.safeguard_adapter) if cfg.safeguard_adapter else None
    if adapter is not None and adapter.exists():
        from peft import PeftModel

        guard = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32),
                                          str(adapter)).merge_and_unload().eval()
        hg = _layer_means(guard, tok, texts)
        out["served_vs_safeguard"] = [{"cka": linear_cka(a, b), "mutual_knn": mutual_knn(l2n(a), l2n(b), k)}
                                      for a, b in zip(hs, hg, strict=True)]
        sg, sr = out["served_vs_safeguard"][g]["mutual_knn"], out["served_vs_random_init"][g]["mutual_knn"]
        checks.append(Check("safeguard_closer_than_random_init_at_guard_layer", "sanity", "mkNN(safeguard) > mkNN(random)",
                            [sg, sr], 0, sg > sr))
    else:
        out["served_vs_safeguard"] = (f"no safeguard adapter configured (safeguard_adapter={cfg.safeguard_adapter!r}); "
                                      "set it to the guard's LoRA folder to compare")
    # neighbouring trained layers resemble each other more than the same layer of an untrained net
    adj = linear_cka(hs[g], hs[g - 1])
    rnd = out["served_vs_random_init"][g]["cka"]
    checks.append(Check("adjacent_layers_closer_than_random_init", "sanity", "CKA(l, l−1) > CKA(served l, random l)",
                        [adj, rnd], 0, adj > rnd))
    return checks, out


Config.METHODS = {
    "trained": Method("every MLP trained on its task", train_for),
    "null": Method("every MLP is left at its random initialisation", leave_untrained),
}


@register_suite("repsim", version=3, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    set_threads(1)
    rng = np.random.default_rng(seed)
    checks = _metric_unit_checks(rng, config.knn_k)
    c, claims, tv = _track_v(ctx, config, seed)
    checks += c
    metrics: dict[str, Any] = {"track_v": tv}
    if config.llm_texts > 0:
        ctx.progress(0.65, "Track L (guard diagnostic): served model layers")
        c, tl = _track_l(ctx, config, seed)
        checks += c
        # not part of the paper: how far the guard's safeguard model drifts from the served model
        metrics["track_l_guard_diagnostic"] = tl
    metrics["headline_spearman_mutual_knn"] = tv["spearman"]["mutual_knn"]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    fs = list(map(float, tv["per_overlap"]))
    for key in ("mutual_knn", "cka", "ood_mutual_knn", "transfer_asr"):
        ax.plot(fs, [tv["per_overlap"][str(f)][key] for f in fs], "o-", label=key)
    ax.set_xlabel("dataset overlap f")
    ax.legend(fontsize=7)
    ctx.save_figure("repsim_overlap.png", fig)
    ctx.save_json("repsim_metrics.json", metrics)
    reference = {"paper_resnet18_cifar100_dataset_overlap_0_to_1": {"mutual_knn": [0.184, 0.247], "cka": [0.455, 0.574]},
                 "research_prototype_digits_mlp": {"mutual_knn": [0.675, 0.855], "cka": [0.926, 0.987],
                                                   "transfer_asr": [0.333, 0.493]},
                 "verified_against_paper": False}
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims)
