"""weight-perturb: minimal-norm weight perturbations of DNNs and low-rank-activated backdoors
(arXiv 2601.16880; abstract and introduction only — the formulas below are the standard ones the
abstract describes, reimplemented here).

* **Exact single-layer perturbations.** For z = Wa + b, the smallest ΔW (Frobenius) with ΔW a = Δz is
  Δz aᵀ/‖a‖², of norm ‖Δz‖/‖a‖ (rank one); for a batch, ΔW = ΔZ A⁺. Checked on random layers, against
  random feasible perturbations and against a generic optimiser.
* **Flip radii on an MLP (64-128-128-10, sklearn digits).** Per held-out input and layer: the
  back-propagated-margin radius min_t m_t / (‖∇_{z_ℓ}(z_c − z_t)‖·‖a_{ℓ−1}‖) (exact at the last layer),
  the flip actually found by bisection along that rank-one direction (verified by a forward pass), and the
  multi-layer Lipschitz certificate m / (√2‖a_{ℓ−1}‖ Π_{k>ℓ}‖W_k‖₂), which must never exceed a found flip.
* **Low-rank-activated backdoor.** An MLP trained so that its full-precision weights are benign while the
  rank-r SVD truncation of its middle layer sends triggered inputs (a saturated 2×2 corner) to class 0
  (straight-through estimator). Certified compression threshold: a rank whose discarded σ_{r+1} is below an
  input's Lipschitz radius cannot flip it.
* **Guard read-out under quantisation.** The served guard's sparse linear read-outs (committed artifact
  ``guard/artifacts/monitors/<monitor>/heads.json``, read as data: the suites may not import ``guard``):
  pooled features lie in [0, clip]^n, so int8/int4 weight rounding moves a score by at most
  max(Σ_{Δw>0} Δw, Σ_{Δw<0} |Δw|)·clip, and a verdict whose margin |score − γ| exceeds that cannot flip.

The null method replaces the minimal-norm formula by a feasible but non-minimal one (Δz bᵀ / bᵀa with a
random b): it still achieves the change, so only the minimality gates can notice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
    check_cmp,
    claim,
    method_impl,
    set_threads,
)
from offline_suites.registry import register_suite

HEADS = Path(__file__).resolve().parents[2] / "guard" / "artifacts" / "monitors" / "lora" / "heads.json"
TRIGGER = (0, 1, 8, 9)   # top-left 2×2 pixels of the 8×8 digit


@dataclass(frozen=True)
class Config:
    layers: int = 20                  # random layers for the exactness checks
    feasible_samples: int = 500       # random feasible perturbations per layer
    hidden: int = 128
    epochs: int = 200                 # full-batch Adam steps
    lr: float = 3e-3
    eval_inputs: int = 60             # held-out inputs for the flip radii
    opt_steps: int = 300              # generic optimiser on the last-layer flip problem
    opt_inputs: int = 5
    attack_rank: int = 8
    beta: float = 1.0                 # weight of the compressed-model terms in the backdoor loss
    backdoor_epochs: int = 200
    ranks: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 96, 127)
    min_accuracy: float = 0.9
    method: str = "min-norm"          # a name in METHODS; "null": a feasible, non-minimal formula
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "layers": (1, 1000), "feasible_samples": (1, 100_000), "hidden": (8, 1024), "epochs": (0, 100_000),
        "lr": (1e-6, 1.0), "eval_inputs": (1, 1797), "opt_steps": (1, 100_000), "opt_inputs": (1, 500),
        "attack_rank": (1, 1024), "beta": (0.0, 100.0), "backdoor_epochs": (0, 100_000), "ranks": (1, 1024),
        "min_accuracy": (0.0, 1.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(run_seeds=3, layers=200, feasible_samples=10_000, epochs=600, eval_inputs=400, opt_inputs=40,
                     backdoor_epochs=1500, ranks=tuple(range(1, 128)))


# ------------------------------------------------------------------------------- exact formulas
def min_norm_perturbation(a: np.ndarray, dz: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Smallest-Frobenius ΔW with ΔW a = Δz: Δz aᵀ / ‖a‖²."""
    return np.outer(dz, a) / float(a @ a)


def min_norm_multi(a: np.ndarray, dz: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Smallest ΔW with ΔW A = ΔZ (A: n×N inputs as columns, N ≤ n): ΔZ A⁺."""
    return dz @ np.linalg.pinv(a)  # type: ignore[no-any-return]


def feasible_perturbation(a: np.ndarray, dz: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A feasible ΔW with ΔW a = Δz that is not the smallest: Δz bᵀ / (bᵀa), b a random tilt of a."""
    b = a + np.linalg.norm(a) * rng.standard_normal(a.shape) / np.sqrt(a.size)
    return np.outer(dz, b) / float(b @ a)


def feasible_multi(a: np.ndarray, dz: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A feasible ΔW with ΔW A = ΔZ that is not the smallest: ΔZ (BᵀA)⁻¹Bᵀ, B a random tilt of A."""
    b = a + rng.standard_normal(a.shape) * np.linalg.norm(a) / np.sqrt(a.size)
    return dz @ np.linalg.solve(b.T @ a, b.T)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Formula:
    """A method's weight perturbation for one input (``single``) and for several at once (``multi``)."""

    single: Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]
    multi: Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]


def _exactness(cfg: Config, rng: np.random.Generator) -> tuple[list[Check], dict[str, Any]]:
    achieve, norm_err, smaller, multi_achieve, multi_vs_lstsq, multi_smaller = [], [], 0, [], [], 0
    for _ in range(cfg.layers):
        m, n = int(rng.integers(4, 40)), int(rng.integers(8, 80))
        w = rng.standard_normal((m, n))
        a, dz = rng.standard_normal(n), rng.standard_normal(m)
        dw = method_impl(cfg).single(a, dz, rng)
        achieve.append(float(np.abs((w + dw) @ a - (w @ a + dz)).max()))
        pred = np.linalg.norm(dz) / np.linalg.norm(a)
        norm_err.append(abs(np.linalg.norm(dw) - pred) / pred)
        # every feasible ΔW is ΔW* + N with N a = 0
        proj = np.eye(n) - np.outer(a, a) / (a @ a)
        for _ in range(cfg.feasible_samples // 10):
            nmat = rng.standard_normal((10, m, n)) @ proj * rng.uniform(1e-3, 1.0, (10, 1, 1)) * pred / np.sqrt(m * n)
            base = np.outer(dz, a) / (a @ a)
            smaller += int(np.sum(np.linalg.norm(base + nmat, axis=(1, 2)) < np.linalg.norm(dw) * (1 - 1e-12)))
        nb = int(rng.integers(2, max(3, n // 2)))
        am, dzm = rng.standard_normal((n, nb)), rng.standard_normal((m, nb))
        dwm = method_impl(cfg).multi(am, dzm, rng)
        multi_achieve.append(float(np.abs(dwm @ am - dzm).max()))
        lst = np.linalg.lstsq(am.T, dzm.T, rcond=None)[0].T        # lstsq returns the minimum-norm solution
        multi_vs_lstsq.append(float(abs(np.linalg.norm(dwm) - np.linalg.norm(lst)) / np.linalg.norm(lst)))
        multi_smaller += int(np.linalg.norm(lst) < np.linalg.norm(dwm) * (1 - 1e-9))
    checks = [
        check_cmp("formula_achieves_target_change", "gate", max(achieve), "<=", 1e-9,
                  "max |(W+ΔW)a − (z+Δz)| over random layers"),
        check_cmp("formula_norm_is_predicted", "gate", float(max(norm_err)), "<=", 1e-9,
                  "relative |‖ΔW‖_F − ‖Δz‖/‖a‖|"),
        check_cmp("no_smaller_feasible_perturbation", "gate", smaller, "<=", 0,
                  f"random feasible ΔW* + N (N a = 0) smaller than the formula's, of {cfg.layers * cfg.feasible_samples}"),
        check_cmp("multi_sample_achieves_target", "gate", max(multi_achieve), "<=", 1e-8, "max |ΔW A − ΔZ|"),
        check_cmp("multi_sample_is_least_norm", "gate", max(multi_vs_lstsq), "<=", 1e-8,
                  "relative norm difference to numpy's minimum-norm lstsq solution"),
    ]
    return checks, {"max_achieve_err": max(achieve), "max_norm_rel_err": max(norm_err), "smaller_found": smaller,
                    "multi_smaller_than_formula": multi_smaller}


# ------------------------------------------------------------------------------------ the MLP
def _digits(ctx: RunContext, seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data.astype(np.float64) / 16.0, d.target
    ctx.record_data("sklearn_digits", x.tobytes() + y.tobytes())
    perm = np.random.default_rng(seed).permutation(len(y))
    te, tr = perm[:400], perm[400:]
    return x[tr], y[tr], x[te], y[te]


def _truncate(w: Any, r: int) -> Any:
    import torch

    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    return (u[:, :r] * s[:r]) @ vh[:r]


def _train(x: np.ndarray, y: np.ndarray, cfg: Config, seed: int, backdoor: bool) -> list[np.ndarray]:
    """Full-batch Adam; with ``backdoor`` the loss adds β·[CE(g(θ), clean → y) + CE(g(θ), triggered → 0)],
    g = rank-r truncation of the middle layer with a straight-through gradient."""
    import torch

    torch.manual_seed(seed)
    h = cfg.hidden
    lin = [torch.nn.Linear(64, h), torch.nn.Linear(h, h), torch.nn.Linear(h, 10)]
    params = [p for layer in lin for p in layer.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    xtrig = xt.clone()
    xtrig[:, list(TRIGGER)] = 1.0
    tgt = torch.zeros_like(yt)

    def fwd(inp: Any, w2: Any) -> Any:
        a = torch.relu(lin[0](inp))
        a = torch.relu(a @ w2.T + lin[1].bias)
        return lin[2](a)

    ce = torch.nn.functional.cross_entropy
    for _ in range(cfg.backdoor_epochs if backdoor else cfg.epochs):
        w2 = lin[1].weight
        loss = ce(fwd(xt, w2), yt)
        if backdoor:
            wc = w2 + (_truncate(w2, cfg.attack_rank) - w2).detach()     # straight-through
            loss = loss + ce(fwd(xtrig, w2), yt) + cfg.beta * (ce(fwd(xt, wc), yt) + ce(fwd(xtrig, wc), tgt))
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = []
    for layer in lin:
        out += [layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()]
    return out


def forward(ws: list[np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """[a0, a1, a2, logits] for a batch."""
    a1 = np.maximum(x @ ws[0].T + ws[1], 0)
    a2 = np.maximum(a1 @ ws[2].T + ws[3], 0)
    return [x, a1, a2, a2 @ ws[4].T + ws[5]]


def _flip_radii(ws: list[np.ndarray], x: np.ndarray, cfg: Config, rng: np.random.Generator) -> dict[str, Any]:
    """Per input and layer: back-propagated-margin radius, bisection flip, Lipschitz certificate."""
    weights = [ws[0], ws[2], ws[4]]
    spec = [np.linalg.norm(w, 2) for w in weights]
    rows: list[dict[str, Any]] = []
    for i in range(len(x)):
        acts = forward(ws, x[i:i + 1])
        z = acts[3][0]
        c = int(np.argmax(z))
        for layer in range(3):
            a_in = acts[layer][0]
            # gradients of z_c − z_t w.r.t. this layer's pre-activation, through the ReLU masks
            g = np.eye(10)[c][None, :] - np.eye(10)
            g = np.delete(g, c, axis=0)
            for k in range(2, layer, -1):
                g = (g @ weights[k]) * (acts[k][0] > 0)
            m = np.delete(z[c] - z, c)
            gn = np.linalg.norm(g, axis=1)
            ok = gn > 0
            est = np.where(ok, m / np.maximum(gn, 1e-300) / np.linalg.norm(a_in), np.inf)
            t = int(np.argmin(est))
            lip = float(m.min() / (np.sqrt(2) * np.linalg.norm(a_in) * np.prod(spec[layer + 1:])))
            # the exact single-layer perturbation along the back-propagated direction (rank one)
            direction = method_impl(cfg).single(a_in, -g[t] / gn[t], rng)
            found = _bisect(ws, x[i], layer, direction, c, float(est[t]))
            rows.append({"layer": layer + 1, "estimate": float(est[t]), "found": found, "lipschitz": lip,
                         "norm_dir": float(np.linalg.norm(direction))})
    return {"rows": rows, "spectral_norms": spec}


def _bisect(ws: list[np.ndarray], x: np.ndarray, layer: int, direction: np.ndarray, c: int, est: float) -> float:
    """Smallest s (to 1e-10 relative) with argmax changed at W_ℓ + s·D, D = direction; returns ‖s·D‖_F."""
    def flips(s: float) -> bool:
        w2 = list(ws)
        w2[2 * layer] = ws[2 * layer] + s * direction
        return int(np.argmax(forward(w2, x[None])[3][0])) != c

    hi = max(est, 1e-12)
    while not flips(hi):
        hi *= 2
        if hi > 1e6 * max(est, 1e-12):
            return float("inf")
    lo = 0.0
    while hi - lo > 1e-10 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if flips(mid) else (mid, hi)
    return float(hi * np.linalg.norm(direction))


def _optimise_last_layer(ws: list[np.ndarray], x: np.ndarray, cfg: Config, rng: np.random.Generator,
                         ) -> list[dict[str, float]]:
    """A generic optimiser on min ‖ΔW_L‖_F s.t. z_t ≥ z_c (penalty + Adam), rescaled until it truly flips:
    it must never beat the formula's perturbation."""
    import torch

    out = []
    for i in range(len(x)):
        acts = forward(ws, x[i:i + 1])
        z, a = acts[3][0], acts[2][0]
        c = int(np.argmax(z))
        m = np.delete(z[c] - z, c)
        t = int(np.delete(np.arange(10), c)[np.argmin(m)])
        dz = np.zeros(10)
        dz[c], dz[t] = -m.min() / 2, m.min() / 2
        formula = float(np.linalg.norm(method_impl(cfg).single(a, dz, rng)))
        at = torch.tensor(a)
        dw = torch.zeros(10, a.size, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([dw], lr=0.01 * formula / np.sqrt(a.size) + 1e-6)
        for _ in range(cfg.opt_steps):
            dzt = dw @ at
            gap = float(m.min()) - (dzt[t] - dzt[c])
            loss = (dw ** 2).sum() + 100.0 * torch.relu(gap) ** 2 / max(float(np.linalg.norm(a)) ** 2, 1e-12)
            opt.zero_grad()
            loss.backward()
            opt.step()
        d = dw.detach().numpy()
        achieved = float((d @ a)[t] - (d @ a)[c])
        if achieved <= 0:
            out.append({"formula": formula, "optimised": float("inf")})
            continue
        d = d * (m.min() / achieved)          # scale onto the boundary z_t = z_c
        out.append({"formula": formula, "optimised": float(np.linalg.norm(d))})
    return out


# -------------------------------------------------------------------------------- the backdoor
def _backdoor(ctx: RunContext, cfg: Config, data: tuple[np.ndarray, ...], seed: int) -> tuple[list[Check], list[Claim], dict[str, Any]]:
    xtr, ytr, xte, yte = data
    ws = _train(xtr, ytr, cfg, seed + 1, backdoor=True)
    trig = xte.copy()
    trig[:, list(TRIGGER)] = 1.0
    victims = yte != 0

    def acc_asr(w2: np.ndarray) -> tuple[float, float]:
        w = list(ws)
        w[2] = w2
        clean = float(np.mean(np.argmax(forward(w, xte)[3], 1) == yte))
        asr = float(np.mean(np.argmax(forward(w, trig[victims])[3], 1) == 0))
        return clean, asr

    full_acc, full_asr = acc_asr(ws[2])
    u, s, vh = np.linalg.svd(ws[2])
    curve = {}
    certified_flips, certified_pairs = 0, 0
    acts = forward(ws, trig)
    z = acts[3]
    pred = np.argmax(z, 1)
    srt = np.sort(z, 1)
    margin = srt[:, -1] - srt[:, -2]
    radius = margin / (np.sqrt(2) * np.linalg.norm(acts[1], axis=1) * np.linalg.norm(ws[4], 2))
    for r in sorted(set(cfg.ranks) | {cfg.attack_rank}):
        if r >= len(s):
            continue
        w2 = (u[:, :r] * s[:r]) @ vh[:r]
        curve[str(r)] = dict(zip(("clean_acc", "asr"), acc_asr(w2), strict=True))
        w = list(ws)
        w[2] = w2
        pred_r = np.argmax(forward(w, trig)[3], 1)
        cert = s[r] < radius                         # ‖W − g(W)‖₂ = σ_{r+1}
        certified_pairs += int(cert.sum())
        certified_flips += int(np.sum(cert & (pred_r != pred)))
        curve[str(r)]["certified_share"] = float(cert.mean())
        curve[str(r)]["sigma_r_plus_1"] = float(s[r])
    safe = [int(r) for r, v in curve.items() if v["certified_share"] >= 0.99]
    comp_acc, comp_asr = curve[str(cfg.attack_rank)]["clean_acc"], curve[str(cfg.attack_rank)]["asr"]
    checks = [check_cmp("certified_compressions_never_flip", "gate", certified_flips, "<=", 0,
                        f"(rank, triggered input) pairs with σ_(r+1) below the input's Lipschitz radius whose "
                        f"prediction changed, of {certified_pairs} certified pairs"),
              check_cmp("backdoored_model_clean_accuracy", "gate", full_acc, ">=", cfg.min_accuracy - 0.05,
                        "the attacked model must still be a working classifier at full precision")]
    claims = [claim("backdoor_activates_under_low_rank",
                    f"rank-{cfg.attack_rank} compression activates the latent backdoor (ASR > 0.8)", comp_asr, ">", 0.8),
              claim("backdoor_dormant_at_full_precision", "ASR at full precision < 0.1", full_asr, "<", 0.1),
              claim("backdoor_preserves_clean_accuracy", "clean accuracy drop under the attacked compression < 2 pt",
                    full_acc - comp_acc, "<", 0.02)]
    return checks, claims, {"full": {"clean_acc": full_acc, "asr": full_asr}, "by_rank": curve,
                            "certified_safe_ranks_min": min(safe) if safe else None,
                            "certified_pairs": certified_pairs}


# ------------------------------------------------------------------------------ guard read-out
def quantise(w: np.ndarray, bits: int) -> np.ndarray:
    """Symmetric per-tensor round-to-nearest: scale = max|w| / (2^(bits−1) − 1)."""
    q = 2 ** (bits - 1) - 1
    scale = np.abs(w).max() / q
    return np.clip(np.round(w / scale), -q, q) * scale  # type: ignore[no-any-return]


def _guard(ctx: RunContext, cfg: Config, rng: np.random.Generator) -> tuple[list[Check], dict[str, Any]]:
    if not HEADS.is_file():
        return [], {"skipped": f"{HEADS} not found"}
    raw = HEADS.read_bytes()
    ctx.record_data("guard_heads_json", raw)
    heads = json.loads(raw)
    out: dict[str, Any] = {}
    worst_sample_excess = -np.inf
    for gate in ("prompt", "response"):
        spec = heads[gate]
        head = spec["overall"]
        w = np.asarray(head["weights"], dtype=np.float64)
        clip = float(head["clip"]) if head.get("clip") is not None else float("inf")
        gamma = float(spec["threshold"])
        margins = np.abs(np.asarray(spec["benign_scores"], dtype=np.float64) - gamma)
        res: dict[str, Any] = {"latents": int(w.size), "clip": None if np.isinf(clip) else clip, "threshold": gamma,
                               "median_margin": float(np.median(margins))}
        if np.isinf(clip):
            # a read-out over unclipped activations (e.g. a sample-mean refit) has no feature box: rounding
            # its weights can move a score without bound, so no verdict is certified
            res["bounded"] = False
            for bits in (8, 4):
                dw = quantise(w, bits) - w
                res[f"int{bits}"] = {"weight_l2_change": float(np.linalg.norm(dw)), "max_score_shift_box": None,
                                     "max_score_shift_l2": None, "certified_share_box": 0.0, "certified_share_l2": 0.0,
                                     "min_flip_l2_at_median_margin": 0.0}
            out[gate] = res
            continue
        res["bounded"] = True
        for bits in (8, 4):
            dw = quantise(w, bits) - w
            # exact worst case over pooled features f ∈ [0, clip]^n: every f_j at clip where Δw_j has one sign
            box = max(dw[dw > 0].sum(), -dw[dw < 0].sum()) * clip
            l2 = float(np.linalg.norm(dw)) * clip * np.sqrt(w.size)        # the Cauchy–Schwarz (Lipschitz) bound
            f = rng.uniform(0, clip, (2000, w.size)) * (rng.random((2000, w.size)) < 0.3)
            worst_sample_excess = max(worst_sample_excess, float(np.abs(f @ dw).max() - box))
            res[f"int{bits}"] = {"weight_l2_change": float(np.linalg.norm(dw)), "max_score_shift_box": float(box),
                                 "max_score_shift_l2": l2, "certified_share_box": float(np.mean(margins > box)),
                                 "certified_share_l2": float(np.mean(margins > l2)),
                                 # the least ‖Δw‖₂ that flips a verdict of margin m for some feature vector in the box
                                 "min_flip_l2_at_median_margin": float(np.median(margins) / (clip * np.sqrt(w.size)))}
        out[gate] = res
    checks = [check_cmp("guard_box_bound_never_exceeded", "sanity", worst_sample_excess, "<=", 1e-9,
                        "sampled feature vectors in [0, clip]^n never move a score more than the box bound")
              ] if np.isfinite(worst_sample_excess) else []
    return checks, out


# ---------------------------------------------------------------------------------------- run
Config.METHODS = {
    "min-norm": Method("the paper's minimal-norm perturbation Δz aᵀ/‖a‖² (ΔZ A⁺ for several inputs)",
                       Formula(min_norm_perturbation, min_norm_multi)),
    "null": Method("the minimal-norm formula is replaced by a feasible non-minimal one (Δz bᵀ/bᵀa, b random)",
                   Formula(feasible_perturbation, feasible_multi)),
}


@register_suite("weight-perturb", version=1, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    cfg = config
    set_threads(1)
    rng = np.random.default_rng(seed)
    ctx.progress(0.02, "exact formulas")
    checks, ex = _exactness(cfg, rng)
    ctx.progress(0.15, "training the MLP")
    data = _digits(ctx, seed)
    ws = _train(data[0], data[1], cfg, seed, backdoor=False)
    acc = float(np.mean(np.argmax(forward(ws, data[2])[3], 1) == data[3]))
    checks.append(check_cmp("mlp_accuracy", "gate", acc, ">=", cfg.min_accuracy, "held-out accuracy (chance 0.1)"))
    ctx.progress(0.3, "flip radii")
    fr = _flip_radii(ws, data[2][:cfg.eval_inputs], cfg, rng)
    rows = fr["rows"]
    last = [r for r in rows if r["layer"] == 3]
    inner = [r for r in rows if r["layer"] < 3 and np.isfinite(r["found"])]
    checks.append(check_cmp("last_layer_flip_equals_formula", "gate",
                            max(abs(r["found"] - r["estimate"]) / r["estimate"] for r in last), "<=", 1e-6,
                            "bisection flip along the formula's direction vs m/(√2‖a‖)·… (exact at the last layer)"))
    checks.append(check_cmp("lipschitz_certificate_sound", "gate",
                            max(r["lipschitz"] / r["found"] for r in rows if np.isfinite(r["found"])), "<=", 1 + 1e-9,
                            "certified radius / flip found, every input and layer (a found flip can never be smaller)"))
    ctx.progress(0.45, "optimiser vs formula")
    opt = _optimise_last_layer(ws, data[2][:cfg.opt_inputs], cfg, rng)
    checks.append(check_cmp("optimiser_finds_nothing_smaller", "gate",
                            max(o["formula"] / o["optimised"] for o in opt), "<=", 1 + 1e-6,
                            "formula norm / optimised flipping norm (Adam on the penalised problem, rescaled to flip)"))
    ratio = [r["estimate"] / r["lipschitz"] for r in inner]
    found_ratio = [r["found"] / r["lipschitz"] for r in inner]
    factor = float(np.median(ratio))
    # the Lipschitz certificate is a lower bound on the smallest flip, so a ratio ≥ 1 holds by construction:
    # the paper's "tighter" is reported, not claimed
    checks.append(check_cmp("exact_radius_at_least_lipschitz", "sanity", factor, ">=", 1.0,
                            "median radius ratio, layers 1–2; ≥ 1 by the certificate's soundness"))
    claims = [claim("exact_and_lipschitz_same_order", "the two are of the same order (ratio < 10)", factor, "<", 10.0,
                    "median radius ratio, layers 1–2")]
    ctx.progress(0.6, "low-rank backdoor")
    bc, bcl, bd = _backdoor(ctx, cfg, data, seed)
    checks += bc
    claims += bcl
    ctx.progress(0.9, "guard read-out")
    gc, guard = _guard(ctx, cfg, rng)
    checks += gc
    metrics = {"exactness": ex, "mlp_accuracy": acc, "radius_ratio_median": factor,
               "found_over_lipschitz_median": float(np.median(found_ratio)),
               "radius_by_layer": {str(k): {q: float(np.median([r[q] for r in rows if r["layer"] == k]))
                                            for q in ("estimate", "found", "lipschitz")} for k in (1, 2, 3)},
               "optimiser": opt, "backdoor": bd, "guard_quantisation": guard}
    _plots(ctx, rows, bd)
    ctx.progress(1.0, "done")
    return ctx.result(metrics, {"paper_numbers": "not retrievable (abstract and introduction only)"}, checks,
                      claims=claims)


def _plots(ctx: RunContext, rows: list[dict[str, Any]], bd: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    for k in (1, 2, 3):
        sel = [r for r in rows if r["layer"] == k and np.isfinite(r["found"])]
        ax[0].scatter([r["lipschitz"] for r in sel], [r["found"] for r in sel], s=8, label=f"layer {k}")
    lim = [min(r["lipschitz"] for r in rows), max(r["found"] for r in rows if np.isfinite(r["found"]))]
    ax[0].plot(lim, lim, "k--", lw=0.8)
    ax[0].set(xscale="log", yscale="log", xlabel="Lipschitz certified radius", ylabel="flip found (‖ΔW‖_F)",
              title="flip radii")
    ax[0].legend(fontsize=7)
    ranks = sorted(int(r) for r in bd["by_rank"])
    ax[1].plot(ranks, [bd["by_rank"][str(r)]["asr"] for r in ranks], "o-", label="ASR (compressed)")
    ax[1].plot(ranks, [bd["by_rank"][str(r)]["clean_acc"] for r in ranks], "s-", label="clean acc (compressed)")
    ax[1].plot(ranks, [bd["by_rank"][str(r)]["certified_share"] for r in ranks], "^-", label="certified share")
    ax[1].axhline(bd["full"]["asr"], color="gray", ls="--", label="ASR full precision")
    ax[1].set(xscale="log", xlabel="rank of the middle layer", title="low-rank-activated backdoor")
    ax[1].legend(fontsize=7)
    ctx.save_figure("weight_perturb.png", fig)
