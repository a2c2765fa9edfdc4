"""iterated-erm: "Asymptotic theory of iterated ERM, with applications to active learning" (Cui, Lu;
arXiv 2601.23031). Monte Carlo on the paper's setting, reimplemented from the abstract.

Data: a balanced symmetric Gaussian mixture x = yμ + z, z ~ N(0, I_d), ‖μ‖² = ρ, in the proportional
regime (sample sizes ∝ d). A linear classifier sign(wᵀx) has test error exactly Q(μᵀw / ‖w‖).

* **Single stage.** The linear-loss ERM ŵ = argmin −Σ yᵢ wᵀxᵢ + (n/2)‖w‖² (= the class-mean difference)
  has the closed asymptotic error Q(ρ / √(ρ + 1/α)), α = n/d; ridge ERM is measured alongside.
* **Iterated ERM / pool-based active learning.** A budget of B labels: κB random points fit ŵ₁ (ridge),
  the (1−κ)B pool points with the smallest |ŵ₁ᵀx| (uncertainty sampling) are labelled, and ŵ₂ is the ridge
  ERM on both sets, stage-1 points reused. Swept over κ (the allocation trade-off) and, at a fixed
  stage-2 sample count, over the selection sharpness (the share of the pool eligible), where the paper
  reports double descent driven by selection alone. Baseline: passive learning (B random labels).

The paper's fixed-point predictions for the second stage were not readable here, so stage 2 is Monte
Carlo only; what is checked against theory is the single-stage formula, and no gate or claim compares stage
two with a theoretical prediction (deriving the paper's equations ourselves would test our derivation, not
theirs). The null method replaces every ERM by a random direction (an untrained classifier).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    method_impl,
)
from offline_suites.registry import register_suite


@dataclass(frozen=True)
class Config:
    d: int = 200
    rho: float = 2.0                         # ‖μ‖²
    alphas: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)   # n/d for the single-stage check
    trials: int = 24
    pool_factor: float = 8.0                 # unlabelled pool N = pool_factor·d
    budget_factor: float = 1.0               # labelling budget B = budget_factor·d
    kappas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
    lam1: float = 1.0                        # stage-1 ridge penalty (per sample: λ·n)
    lam2: float = 1.0                        # stage-2 ridge penalty (per sample)
    dd_n2_factor: float = 1.0                # selection sweep: stage-2 sample count n₂ = factor·d
    dd_ratios: tuple[float, ...] = (1.0, 0.6, 0.35, 0.2, 0.12)  # n₂ / eligible pool
    dd_trials: int = 8                       # trials per point of the selection sweep (logistic fits are slow)
    dd_lam2: float = 1e-4                    # near-unregularised logistic stage 2 in the selection sweep
    test_points: int = 20000                 # fresh points to validate the Q(m/√q) formula
    z_tol: float = 4.0                       # MC tolerance in standard errors
    method: str = "erm"                      # a name in METHODS; "null": every ERM → a random direction
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "d": (20, 4000), "rho": (0.01, 100.0), "alphas": (0.05, 50.0), "trials": (2, 1000),
        "pool_factor": (1.0, 50.0), "budget_factor": (0.05, 20.0), "kappas": (0.01, 0.99),
        "lam1": (1e-6, 1e3), "lam2": (1e-6, 1e3), "dd_n2_factor": (0.05, 10.0), "dd_ratios": (0.01, 1.0),
        "dd_lam2": (1e-8, 1e3), "dd_trials": (2, 1000), "test_points": (100, 1_000_000), "z_tol": (1.0, 10.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(run_seeds=3, d=400, trials=60, alphas=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
                     kappas=(0.03, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                     dd_ratios=(1.0, 0.8, 0.6, 0.45, 0.35, 0.25, 0.2, 0.15, 0.1), pool_factor=12.0, dd_trials=24)


def q_func(x: np.ndarray | float) -> np.ndarray | float:
    from scipy.special import ndtr

    return ndtr(-np.asarray(x))  # type: ignore[no-any-return]


def test_error(w: np.ndarray, mu: np.ndarray) -> float:
    """Exact error of sign(wᵀx) on the mixture: P(N(μᵀw, ‖w‖²) < 0)."""
    nrm = float(np.linalg.norm(w))
    return float(q_func(float(mu @ w) / nrm)) if nrm > 0 else 0.5


def single_stage_asymptotic(rho: float, alpha: float) -> float:
    """Mean-difference ERM: m/√q → ρ / √(ρ + 1/α) (m = nρ + O(√n), q = n²ρ + nd + O(n√n))."""
    return float(q_func(rho / np.sqrt(rho + 1.0 / alpha)))


def sample(rng: np.random.Generator, n: int, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = rng.choice(np.array([-1.0, 1.0]), size=n)
    return y[:, None] * mu[None, :] + rng.standard_normal((n, mu.size)), y


class Fitter:
    """Every ERM of the suite: the class-mean difference, ridge and logistic regression."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def mean_diff(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x.T @ y / len(y)  # type: ignore[no-any-return]

    def ridge(self, x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
        """argmin Σ (yᵢ − wᵀxᵢ)² + λ·n‖w‖²."""
        n, d = x.shape
        if n < d:   # the dual form is the same estimator and cheaper below the interpolation threshold
            return x.T @ np.linalg.solve(x @ x.T + lam * n * np.eye(n), y)  # type: ignore[no-any-return]
        return np.linalg.solve(x.T @ x + lam * n * np.eye(d), x.T @ y)  # type: ignore[no-any-return]

    def logistic(self, x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
        """argmin Σ log(1 + e^{−yᵢwᵀxᵢ}) + (λn/2)‖w‖², no intercept (the mixture is symmetric)."""
        from sklearn.linear_model import LogisticRegression

        m = LogisticRegression(C=1.0 / (lam * len(y)), fit_intercept=False, max_iter=2000, tol=1e-6)
        return m.fit(x, y).coef_[0]  # type: ignore[no-any-return]


class RandomFitter(Fitter):
    """The null method: every fit returns a random direction (an untrained classifier), whatever the data."""

    def mean_diff(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.rng.standard_normal((x.shape[1],))

    def ridge(self, x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
        return self.rng.standard_normal((x.shape[1],))

    def logistic(self, x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
        return self.rng.standard_normal((x.shape[1],))


def ridge_grad_norm(w: np.ndarray, x: np.ndarray, y: np.ndarray, lam: float) -> float:
    """Relative norm of the ridge objective's gradient at w (0 at the ERM)."""
    g = x.T @ (x @ w - y) + lam * len(y) * w
    return float(np.linalg.norm(g)) / max(float(np.linalg.norm(x.T @ y)), 1e-300)


def active_learning(fit: Fitter, rng: np.random.Generator, mu: np.ndarray, cfg: Config, kappa: float,
                    n2_override: int | None = None, ratio: float = 1.0, lam2: float | None = None,
                    ) -> dict[str, Any]:
    """One run of two-stage pool-based active learning; returns the errors and the selection audit."""
    d = mu.size
    budget = int(round(cfg.budget_factor * d))
    n1 = max(2, int(round(kappa * budget)))
    n2 = n2_override if n2_override is not None else budget - n1
    # the pool grows when a sharp selection needs more eligible points than pool_factor·d holds
    pool_x, pool_y = sample(rng, max(int(cfg.pool_factor * d), n1 + int(np.ceil(n2 / ratio))), mu)
    first = rng.choice(len(pool_y), size=n1, replace=False)
    w1 = fit.ridge(pool_x[first], pool_y[first], cfg.lam1)
    rest = np.setdiff1d(np.arange(len(pool_y)), first)
    # the sharper the selection, the smaller the eligible share: n₂ most uncertain of ⌈n₂/ratio⌉ random
    eligible = rng.choice(rest, size=min(len(rest), int(np.ceil(n2 / ratio))), replace=False)
    score = np.abs(pool_x[eligible] @ w1)
    chosen = eligible[np.argsort(score, kind="stable")[:n2]]
    idx = np.concatenate([first, chosen]) if n2_override is None else chosen
    lam = cfg.lam2 if lam2 is None else lam2
    if lam2 is not None:   # selection sweep: weakly regularised logistic stage 2 (see _selection_sweep)
        w2 = fit.logistic(pool_x[idx], pool_y[idx], lam)
        return {"err2": test_error(w2, mu), "eligible": len(eligible)}
    w2 = fit.ridge(pool_x[idx], pool_y[idx], lam)
    kth = float(np.sort(score)[n2 - 1]) if n2 > 0 else 0.0
    return {"err1": test_error(w1, mu), "err2": test_error(w2, mu), "n1": n1, "n2": n2,
            "selected_max_score": float(score[np.argsort(score, kind="stable")[:n2]].max()), "kth_score": kth,
            "grad": ridge_grad_norm(w2, pool_x[idx], pool_y[idx], lam)}


Config.METHODS = {
    "erm": Method("every fit is the exact ERM (class-mean difference, ridge, logistic)", Fitter),
    "null": Method("every ERM (stage 1, stage 2, single stage) returns a random direction", RandomFitter),
}


@register_suite("iterated-erm", version=1, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    from threadpoolctl import threadpool_limits

    # one BLAS thread: the box is shared, and a fixed reduction order keeps runs identical
    with threadpool_limits(1):
        return _run(ctx, config, seed)


def _run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    cfg = config
    rng = np.random.default_rng(seed)
    fit: Fitter = method_impl(cfg)(np.random.default_rng(seed + 7))
    d = cfg.d
    mu = rng.standard_normal(d)
    mu *= np.sqrt(cfg.rho) / np.linalg.norm(mu)
    ctx.record_data("mixture_mean", mu.tobytes())
    checks: list[Check] = []
    claims: list[Claim] = []

    # ---- 1. single stage against its closed form; the Q(m/√q) formula against fresh test points
    ctx.progress(0.02, "single-stage ERM")
    single: dict[str, Any] = {}
    for i, a in enumerate(cfg.alphas):
        errs, ridge_errs = [], []
        for _ in range(cfg.trials):
            x, y = sample(rng, max(2, int(round(a * d))), mu)
            errs.append(test_error(fit.mean_diff(x, y), mu))
            ridge_errs.append(test_error(fit.ridge(x, y, cfg.lam1), mu))
        theory = single_stage_asymptotic(cfg.rho, a)
        mean, se = float(np.mean(errs)), float(np.std(errs, ddof=1) / np.sqrt(cfg.trials))
        # tolerance: z standard errors plus a 1/d allowance for the finite-size bias of E[Q(m/√q)]
        checks.append(check_close(f"single_stage_matches_asymptotic_alpha{a:g}", "gate", theory, mean,
                                  cfg.z_tol * se + 1.0 / d,
                                  f"mean-difference ERM, {cfg.trials} trials at d={d}; tol = {cfg.z_tol}·SE + 1/d"))
        single[f"{a:g}"] = {"mc": mean, "se": se, "theory": theory, "ridge_mc": float(np.mean(ridge_errs))}
        ctx.progress(0.02 + 0.2 * (i + 1) / len(cfg.alphas), f"single stage α={a:g}")
    x, y = sample(rng, d, mu)
    w = fit.ridge(x, y, cfg.lam1)
    xt, yt = sample(rng, cfg.test_points, mu)
    emp = float(np.mean(np.sign(xt @ w) != yt))
    formula = test_error(w, mu)
    checks.append(check_close("error_formula_matches_fresh_test_points", "sanity", formula, emp,
                              cfg.z_tol * np.sqrt(formula * (1 - formula) / cfg.test_points),
                              "Q(μᵀw/‖w‖) vs the error on fresh samples (holds for any w)"))
    ctx.record_data("test_sample", xt[:64].tobytes())

    # ---- 2. budget allocation between the stages
    rows: list[dict[str, Any]] = []
    passive: list[float] = []
    total = len(cfg.kappas) * cfg.trials
    for k_i, kappa in enumerate(cfg.kappas):
        for t in range(cfg.trials):
            rows.append({"kappa": kappa, **active_learning(fit, rng, mu, cfg, kappa)})
            if k_i == 0:
                px, py = sample(rng, int(round(cfg.budget_factor * d)), mu)
                passive.append(test_error(fit.ridge(px, py, cfg.lam2), mu))
            ctx.progress(0.22 + 0.5 * (k_i * cfg.trials + t + 1) / total, f"allocation κ={kappa}")
    # passive learning gets as many trials as every κ
    alloc = {f"{k:g}": float(np.mean([r["err2"] for r in rows if r["kappa"] == k])) for k in cfg.kappas}
    alloc_se = {f"{k:g}": float(np.std([r["err2"] for r in rows if r["kappa"] == k], ddof=1) / np.sqrt(cfg.trials))
                for k in cfg.kappas}
    curve = np.array([alloc[f"{k:g}"] for k in cfg.kappas])
    best = int(np.argmin(curve))
    # what must hold of the procedure's output: the selected points are the least certain ones, the
    # labels add up to the budget, and stage 2 is the ERM of its objective
    sel_ok = all(r["selected_max_score"] <= r["kth_score"] + 1e-12 for r in rows)
    checks.append(check_equal("selection_takes_least_certain", "sanity", True, bool(sel_ok),
                              "every selected point has |ŵ₁ᵀx| ≤ the n₂-th smallest among the eligible"))
    budget = int(round(cfg.budget_factor * d))
    checks.append(check_equal("labels_spent_equal_budget", "sanity", True,
                              all(r["n1"] + r["n2"] == budget for r in rows)))
    checks.append(check_cmp("stage2_is_erm", "sanity", max(r["grad"] for r in rows), "<=", 1e-8,
                            "relative gradient norm of the stage-2 ridge objective at ŵ₂"))
    passive_err = float(np.mean(passive))
    # the procedure must learn: stage 2 far below chance, at the best allocation
    checks.append(check_cmp("active_learning_beats_chance", "gate", float(curve[best]), "<=",
                            0.5 - 0.5 * (0.5 - single_stage_asymptotic(cfg.rho, cfg.budget_factor)),
                            "best-κ stage-2 error ≤ halfway between chance and the single-stage asymptote at n = B"))
    interior = 0 < best < len(cfg.kappas) - 1
    ends = min(curve[0], curve[-1])
    k_se = np.array([alloc_se[f"{k:g}"] for k in cfg.kappas])
    end = 0 if curve[0] <= curve[-1] else len(curve) - 1
    passive_se = float(np.std(passive, ddof=1) / np.sqrt(len(passive)))
    # both claims must clear two standard errors of the difference, not just a sign
    claims.append(claim("budget_split_interior_optimum",
                        "the error-minimising share of the budget spent on stage 1 is interior (an allocation trade-off)",
                        float(ends - curve[best]) if interior else -float(curve[best] - min(curve[1:-1])),
                        ">", float(2 * np.hypot(k_se[best], k_se[end])),
                        f"min(error at κ={cfg.kappas[0]}, κ={cfg.kappas[-1]}) − error at κ*={cfg.kappas[best]} "
                        "(negative when κ* is at the edge of the grid); threshold 2 SE of the difference"))
    claims.append(claim("active_beats_passive", "uncertainty sampling at the best split beats B random labels",
                        passive_err - float(curve[best]), ">", float(2 * np.hypot(k_se[best], passive_se)),
                        "passive error − active error at κ*; threshold 2 SE of the difference"))

    # ---- 3. selection-driven double descent: n₂ fixed, only the selection sharpness varies. With a
    # square loss the interpolation peak sits at n₂ = d whatever the selection; with a logistic loss the
    # interpolation (separability) threshold depends on the data distribution, so selection alone can
    # move it across a fixed n₂/d — the one mechanism we know for a peak driven purely by selection.
    n2 = max(2, int(round(cfg.dd_n2_factor * d)))
    dd: dict[str, float] = {}
    dd_se: list[float] = []
    for r_i, ratio in enumerate(cfg.dd_ratios):
        errs = [active_learning(fit, rng, mu, cfg, 0.3, n2_override=n2, ratio=ratio, lam2=cfg.dd_lam2)["err2"]
                for _ in range(cfg.dd_trials)]
        dd[f"{ratio:g}"] = float(np.mean(errs))
        dd_se.append(float(np.std(errs, ddof=1) / np.sqrt(len(errs))))
        ctx.progress(0.72 + 0.23 * (r_i + 1) / len(cfg.dd_ratios), f"selection sweep n₂/eligible={ratio}")
    dcurve = np.array([dd[f"{r:g}"] for r in cfg.dd_ratios])
    peak = int(np.argmax(dcurve))
    bump = float(dcurve[peak] - max(dcurve[0], dcurve[-1])) if 0 < peak < len(dcurve) - 1 else \
        -float(np.ptp(dcurve))
    hi_end = 0 if dcurve[0] >= dcurve[-1] else len(dcurve) - 1
    claims.append(claim("selection_driven_double_descent",
                        "at a fixed stage-2 sample count the error is non-monotone in the selection sharpness "
                        "(an interior peak)", bump, ">", float(2 * np.hypot(dd_se[peak], dd_se[hi_end])),
                        "interior peak − the larger end value (negative, −range, when the peak is at an end); "
                        "threshold 2 SE of the difference"))

    metrics = {"single_stage": single, "allocation": alloc, "allocation_se": alloc_se, "kappa_star": cfg.kappas[best],
               "passive_error": passive_err, "selection_sweep": dd, "selection_sweep_se": dd_se, "selection_n2": n2,
               "stage1_error_by_kappa": {f"{k:g}": float(np.mean([r["err1"] for r in rows if r["kappa"] == k]))
                                         for k in cfg.kappas},
               "formula_vs_fresh": {"formula": formula, "empirical": emp}}
    reference = {"single_stage_asymptotic": {f"{a:g}": single_stage_asymptotic(cfg.rho, a) for a in cfg.alphas},
                 "paper_stage2_fixed_point": "not available (the paper's equations were not readable here)"}
    _plots(ctx, cfg, single, alloc, passive_err, dd)
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims)


def _plots(ctx: RunContext, cfg: Config, single: dict[str, Any], alloc: dict[str, float], passive: float,
           dd: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    a = [float(k) for k in single]
    ax[0].errorbar(a, [v["mc"] for v in single.values()], yerr=[2 * v["se"] for v in single.values()], fmt="o",
                   label="MC mean-difference ERM")
    grid = np.geomspace(min(a), max(a), 100)
    ax[0].plot(grid, [single_stage_asymptotic(cfg.rho, g) for g in grid], "-", label="asymptotic")
    ax[0].plot(a, [v["ridge_mc"] for v in single.values()], "s--", label=f"MC ridge λ={cfg.lam1:g}")
    ax[0].set(xscale="log", xlabel="α = n/d", ylabel="test error", title="single stage")
    ax[0].legend(fontsize=7)
    ax[1].plot(list(cfg.kappas), list(alloc.values()), "o-", label="two-stage (uncertainty)")
    ax[1].axhline(passive, color="gray", ls="--", label="passive")
    ax[1].set(xlabel="κ (stage-1 share of budget)", ylabel="test error", title="budget allocation")
    ax[1].legend(fontsize=7)
    ax[2].plot(list(cfg.dd_ratios), list(dd.values()), "o-")
    ax[2].set(xlabel="n₂ / eligible pool (1 = random)", ylabel="test error", title="selection sweep",
              xscale="log")
    ctx.save_figure("iterated_erm.png", fig)
