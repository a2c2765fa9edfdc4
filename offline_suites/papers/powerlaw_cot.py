"""powerlaw-cot: "How does chain of thought decompose complex tasks?" (Nadgir, Balasubramanian,
Chaudhari; arXiv 2604.08872, ICML 2026). Classification error grows as a power law in the number of
classes, ε(m) ≈ a·m^{2/d} + b (d = intrinsic dimension); a CoT of depth n over a degree-m tree is n
m-way steps whose errors add, giving a critical degree m* = e^{d/2}, an optimal depth and an
unbeatable minimum error (suites-fulltext-notes.md §1, from the authors' likely code
amrutn/explaining_reasoning; reimplemented, not copied).

Arm T (soft): the closed forms, checked numerically — a self-consistency check of the suite's own
formulas, so it does not gate. Arm B (worker-trained): the authors' experiment A — uniform points
on S^{d−1}, labels from m random prototypes (spherical Voronoi), an MLP trained on fresh samples —
fitted with the fixed exponent 2/d and with a free exponent; the gate is that every trained
classifier beats chance by far (the null method leaves them untrained), the power law and its
exponent's fall with d and its distance to 2/d are claims. Arm D (worker-trained): the
decomposition itself — N leaves of a nested spherical Voronoi tree reached by n = log_k N steps of
degree k, one MLP trained on the same samples with the intermediate steps (k < N) or without them
(k = N); the theory's predictions (steps beat direct prediction, too fine steps hurt below m*,
step errors add) are claims. Arm A (served model, claims only): K-way capital-city cloze scored by
log-likelihood, fitted ε(K), the same questions decomposed as continent → capital, and two-hop
questions (capital → country → continent) answered directly or after the model states the
intermediate hop.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import numpy as np

from offline_suites.base import (
    Check,
    Claim,
    ConfigError,
    Method,
    RunContext,
    SuiteResult,
    check_close,
    check_cmp,
    claim,
    leave_untrained,
    method_impl,
    set_threads,
    train_for,
)
from offline_suites.registry import register_suite


@dataclass(frozen=True)
class Config:
    dims: tuple[int, ...] = (3, 4)                       # intrinsic dimensions d of Arm B
    classes: tuple[int, ...] = (8, 16, 32, 64, 128)
    hidden: int = 128
    train_steps: int = 300
    batch: int = 512
    lr: float = 1e-3
    test_samples: int = 4000
    llm_ks: tuple[int, ...] = (2, 8, 32)                 # K-way cloze sizes (empty = skip Arm A)
    llm_questions: int = 4                               # questions per K
    llm_tree_k: int = 4                                  # flat K compared with the 2-level tree
    llm_tree_degree: int = 2                             # continents per tree question
    tree_dims: tuple[int, ...] = (3,)                    # Arm D: intrinsic dimensions of the tree task
    tree_leaves: int = 64                                # Arm D: N leaves; every degree k needs k^n = N
    tree_degrees: tuple[int, ...] = (4, 64)              # Arm D: per-step degrees (k = N is direct prediction)
    tree_steps: int = 300                                # Arm D: training steps per model
    hop_questions: int = 8                               # served two-hop questions (0 = skip)
    hop_k: int = 4                                       # candidate countries for the intermediate hop
    max_error_share_of_chance: float = 0.5               # trained sphere error ≤ this × (1 − 1/m)
    method: str = "trained"          # a name in METHODS; "null" is the untrained model
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "dims": (1, 16), "classes": (2, 5000), "hidden": (1, 4096), "train_steps": (0, 100_000),
        "batch": (1, 65_536), "lr": (1e-6, 1.0), "test_samples": (1, 1_000_000),
        "llm_ks": (2, 121), "llm_questions": (1, 121),          # 121 countries in data/capitals.json
        "llm_tree_k": (2, 64), "llm_tree_degree": (2, 8), "max_error_share_of_chance": (0.0, 1.0),
        "tree_dims": (1, 16), "tree_leaves": (4, 4096), "tree_degrees": (2, 4096), "tree_steps": (0, 100_000),
        "hop_questions": (0, 1000), "hop_k": (2, 121)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config(classes=(8, 32, 128), llm_ks=(2, 16), hop_questions=4)
# Classes stop at 400: past that, at d = 3, a 128-unit net trained for 500 steps errs at more than half of chance
# (0.63 at m = 1,000, 0.72 at m = 1,500, seed 0), which measures the learner's capacity, not the power law.
Config.FULL = Config(run_seeds=3, dims=(3, 4, 5), classes=(10, 16, 25, 40, 64, 100, 160, 250, 400),
                     train_steps=500, test_samples=10000, llm_ks=(2, 4, 8, 16, 32, 64),
                     llm_questions=20, llm_tree_k=16, llm_tree_degree=4, tree_dims=(3, 4),
                     tree_degrees=(2, 4, 8, 64), tree_steps=500, hop_questions=40, hop_k=8)


# ----------------------------------------------------------------------------------- theory (T)
def chain_error(k: float, alpha: float, n_leaves: float, c: float = 1.0) -> float:
    """First-order CoT error for per-step degree k: (ln N / ln k) steps of error c·k^α each."""
    return c * (math.log(n_leaves) / math.log(k)) * k ** alpha


def thinking_gain(m: float, r: float, d: float) -> float:
    """Gain of splitting one m-way step into r steps of degree m^{1/r}: X − r·X^{1/r}, X = m^{2/d}."""
    x = m ** (2 / d)
    return x - r * x ** (1 / r)


def fit_power_law(m: np.ndarray, err: np.ndarray, exponent: float | None) -> dict[str, float]:
    """ε = a·m^α + b; α fixed (linear least squares) or free (scipy curve_fit). Returns a, b, α, R²."""
    from scipy.optimize import curve_fit

    m, err = np.asarray(m, float), np.asarray(err, float)
    if exponent is not None:
        A = np.stack([m ** exponent, np.ones_like(m)], 1)
        (a, b), *_ = np.linalg.lstsq(A, err, rcond=None)
        alpha = exponent
    else:
        (a, alpha, b), _ = curve_fit(lambda x, a, al, b: a * x ** al + b, m, err, p0=(0.01, 0.5, 0.1),
                                     maxfev=20000)
    pred = a * m ** alpha + b
    ss_res = float(((err - pred) ** 2).sum())
    ss_tot = float(((err - err.mean()) ** 2).sum())
    return {"a": float(a), "alpha": float(alpha), "b": float(b), "r2": 1 - ss_res / ss_tot if ss_tot > 0 else 0.0}


def _theory_checks(rng: np.random.Generator) -> tuple[list[Check], dict[str, Any]]:
    from scipy.optimize import minimize_scalar

    checks, ref = [], {}
    for d in (2, 3, 4, 5, 6):
        alpha = 2 / d
        n_leaves = 1e4
        res = minimize_scalar(lambda k, a=alpha, nl=n_leaves: chain_error(k, a, nl), bounds=(1.05, 1e3), method="bounded",
                              options={"xatol": 1e-10})
        checks.append(check_close(f"critical_degree_d{d}", "sanity", math.exp(d / 2), float(res.x), 1e-4,
                                  "argmin_k (ln N/ln k)·k^α = e^{1/α} = e^{d/2}"))
        checks.append(check_close(f"unbeatable_minimum_d{d}", "sanity", math.e * alpha * math.log(n_leaves),
                                  float(res.fun), 1e-8, "E_min = C·e·α·ln N"))
        ref[f"m_star_d{d}"] = math.exp(d / 2)
        # optimal depth factor r* = ln X for a degree m above the critical one
        m = 10 * math.exp(d / 2)
        rr = minimize_scalar(lambda r, m=m, d=d: -thinking_gain(m, r, d), bounds=(1.0, 50.0), method="bounded",
                             options={"xatol": 1e-10})
        checks.append(check_close(f"optimal_depth_factor_d{d}", "sanity", (2 / d) * math.log(m), float(rr.x), 1e-4,
                                  "argmax_r gain = ln X = (2/d)·ln m"))
    # thinking helps iff m > m*: the sign of ∂gain/∂r at r = 1, on random (m, d)
    wrong = 0
    for _ in range(200):
        dim = float(rng.uniform(1.5, 8))
        deg = float(math.exp(dim / 2) * math.exp(rng.uniform(-2, 2)))
        slope = (thinking_gain(deg, 1 + 1e-6, dim) - thinking_gain(deg, 1.0, dim)) / 1e-6
        wrong += (slope > 0) != (deg > math.exp(dim / 2))
    checks.append(Check("thinking_helps_iff_degree_above_critical", "sanity", 0, wrong, 0, wrong == 0,
                        "200 random (m, d): sign of the thinking gain's slope at r = 1"))
    # the fitting code recovers known parameters from noiseless data
    mm = np.array([8, 16, 32, 64, 128, 256], float)
    fit = fit_power_law(mm, 0.02 * mm ** 0.6 + 0.05, None)
    checks.append(check_close("fit_recovers_exponent", "gate", 0.6, fit["alpha"], 1e-6))
    return checks, ref


# -------------------------------------------------------------------------------- Arm B (sphere)
def _sphere_error(d: int, m: int, cfg: Config, seed: int) -> float:
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    protos = torch.nn.functional.normalize(torch.randn(m, d, generator=g), dim=1)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)
        return x, (x @ protos.T).argmax(1)

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
                        nn.Linear(cfg.hidden, m))
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
    for _ in range(method_impl(cfg)(cfg.train_steps)):
        x, y = draw(cfg.batch)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, y = draw(cfg.test_samples)
        return float((net(x).argmax(1) != y).float().mean())


# ------------------------------------------------------------------ Arm D (tree decomposition)
def tree_depth(leaves: int, degree: int) -> int:
    """Depth n with degree^n = leaves; a degree that does not tile the leaves is a config error."""
    n = round(math.log(leaves) / math.log(degree))
    if n < 1 or degree ** n != leaves:
        raise ConfigError(f"tree_degrees: {degree} is not a root of tree_leaves={leaves} (need k^n = N)")
    return n


def _tree_error(d: int, m: int, n: int, cfg: Config, seed: int) -> dict[str, Any]:
    """A degree-m, depth-n tree over S^{d−1}: level t splits every level-(t−1) cell with its own m
    random prototypes (nested spherical Voronoi), so a leaf is an m^n-way class reached by n m-way
    choices. One MLP is trained on the same samples either on the leaf alone (n = 1: direct) or on
    every step of the path, each step seeing x and the digits before it (intermediate steps, teacher
    forced). At test time the chain runs on its own predictions; the teacher-forced error of each
    step is kept to compare the chain with the sum of its step errors."""
    import torch
    from torch import nn

    fn = nn.functional
    g = torch.Generator().manual_seed(seed)
    protos = [fn.normalize(torch.randn(m ** t, m, d, generator=g), dim=2) for t in range(n)]

    def draw(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = fn.normalize(torch.randn(k, d, generator=g), dim=1)
        node = torch.zeros(k, dtype=torch.long)
        digits = []
        for p in protos:
            c = torch.einsum("bd,bkd->bk", x, p[node]).argmax(1)
            digits.append(c)
            node = node * m + c
        return x, torch.stack(digits, 1)

    def inp(x: torch.Tensor, digits: torch.Tensor, level: int) -> torch.Tensor:
        # the known prefix as one-hots (zeros for the digits not yet chosen) and the step index
        pre = torch.zeros(len(x), max(n - 1, 1) * m)
        for t in range(min(level, n - 1)):
            pre[torch.arange(len(x)), t * m + digits[:, t]] = 1.0
        return torch.cat([x, pre, fn.one_hot(torch.full((len(x),), level), n).float()], 1)

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d + max(n - 1, 1) * m + n, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden),
                        nn.ReLU(), nn.Linear(cfg.hidden, m))
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
    for _ in range(method_impl(cfg)(cfg.tree_steps)):
        x, dig = draw(cfg.batch)
        loss = sum(fn.cross_entropy(net(inp(x, dig, t)), dig[:, t]) for t in range(n))
        opt.zero_grad()
        loss.backward()   # type: ignore[union-attr]
        opt.step()
    with torch.no_grad():
        x, dig = draw(cfg.test_samples)
        own = torch.zeros_like(dig)
        step_err = []
        for t in range(n):
            own[:, t] = net(inp(x, own, t)).argmax(1)
            step_err.append(float((net(inp(x, dig, t)).argmax(1) != dig[:, t]).float().mean()))
        chain = float((own != dig).any(1).float().mean())
    return {"degree": m, "depth": n, "error": chain, "step_errors": step_err, "step_error_sum": sum(step_err),
            "independent_prediction": 1 - float(np.prod([1 - e for e in step_err]))}


def _tree_arm(ctx: RunContext, cfg: Config, seed: int) -> tuple[list[Check], list[Claim], dict[str, Any]]:
    checks: list[Check] = []
    claims: list[Claim] = []
    out: dict[str, Any] = {}
    n_leaves = cfg.tree_leaves
    chance = 1 - 1 / n_leaves
    depths = {k: tree_depth(n_leaves, k) for k in cfg.tree_degrees}
    for i, d in enumerate(cfg.tree_dims):
        ctx.progress(0.4 + 0.15 * i / len(cfg.tree_dims), f"tree decomposition d={d}")
        runs = {str(k): _tree_error(d, k, n, cfg, seed * 1000 + d * 101 + k) for k, n in depths.items()}
        out[f"d{d}"] = runs
        worst = max(r["error"] for r in runs.values()) / chance
        checks.append(check_cmp(f"tree_models_beat_chance_d{d}", "gate", worst, "<=", cfg.max_error_share_of_chance,
                                f"max over degrees of leaf error / chance error (1 − 1/{n_leaves})"))
        # exact for any model: the chain fails iff some step fails after a correct prefix, and a
        # step after a correct prefix is the teacher-forced step; step 1 is the same either way
        bounds_ok = all(r["step_errors"][0] - 1e-12 <= r["error"] <= r["step_error_sum"] + 1e-12 for r in runs.values())
        checks.append(Check(f"tree_chain_between_first_step_and_step_sum_d{d}", "sanity", True, bounds_ok, 0, bounds_ok,
                            "ε₁ ≤ chain error ≤ Σ εₜ on the same test points (holds for any model)"))
        chains = {k: r["error"] for k, r in runs.items() if r["depth"] > 1}
        direct = runs.get(str(n_leaves))
        m_star = math.exp(d / 2)
        if direct is not None and chains:
            best = min(chains, key=lambda k: chains[k])
            claims.append(claim(f"tree_steps_beat_direct_d{d}", "a chain of intermediate steps beats predicting the "
                                f"leaf directly (N = {n_leaves} > m* = {m_star:.2f})", direct["error"] - chains[best],
                                ">", 0.0, f"direct error − best chain error (degree {best})"))
        above = [k for k in chains if int(k) >= m_star]
        below = [k for k in chains if int(k) < m_star]
        if above and below:
            lo, hi = min(below, key=int), min(above, key=lambda k: chains[k])
            claims.append(claim(f"tree_below_critical_degree_hurts_d{d}", "below the critical degree m* = e^{d/2}, "
                                "finer steps (a deeper chain) raise the error", chains[lo] - chains[hi], ">", 0.0,
                                f"error(degree {lo}) − error(degree {hi} ≥ m* = {m_star:.2f})"))
        gaps = {k: abs(r["error"] - r["step_error_sum"]) / max(r["error"], 1e-12) for k, r in runs.items()
                if r["depth"] > 1}
        if gaps:
            worst_k = max(gaps, key=lambda k: gaps[k])
            claims.append(claim(f"tree_step_errors_add_d{d}", "a chain's error is the sum of its step errors (first "
                                "order)", gaps[worst_k], "<=", 0.2,
                                f"max over degrees of |chain − Σ εₜ| / chain (worst: degree {worst_k})"))
    return checks, claims, out


# ------------------------------------------------------------------------------ Arm A (served)
def load_capitals() -> list[tuple[str, str, str]]:
    raw = resources.files("offline_suites.papers").joinpath("data/capitals.json").read_text()
    return [tuple(r) for r in json.loads(raw)["rows"]]   # type: ignore[misc]


def _pick(scores: list[float]) -> int:
    return int(np.argmax(scores))


def _llm_arm(ctx: RunContext, cfg: Config, rng: np.random.Generator) -> dict[str, Any]:
    rows = load_capitals()
    ctx.record_data("capitals.json", json.dumps(rows))
    caps = [r[1] for r in rows]
    flat: dict[str, Any] = {}
    total = len(cfg.llm_ks) + 1
    for i, k in enumerate(cfg.llm_ks):
        ctx.progress(0.55 + 0.35 * i / total, f"served model: {k}-way cloze")
        qs = rng.choice(len(rows), size=cfg.llm_questions, replace=False)
        errs = 0
        for q in qs:
            others = [c for j, c in enumerate(caps) if j != q]
            opts = [rows[q][1], *rng.choice(others, size=k - 1, replace=False).tolist()]
            scores = ctx.llm.continuation_logprobs(f"The capital of {rows[q][0]} is", [" " + o for o in opts])
            errs += _pick(scores) != 0
        flat[str(k)] = {"error": errs / len(qs), "chance_error": 1 - 1 / k, "questions": len(qs)}

    # tree: K = degree × (K/degree) candidates, one block of capitals per continent
    ctx.progress(0.55 + 0.35 * (total - 1) / total, "served model: continent → capital tree")
    k, deg = cfg.llm_tree_k, cfg.llm_tree_degree
    per = k // deg
    by_cont: dict[str, list[int]] = {}
    for j, r in enumerate(rows):
        by_cont.setdefault(r[2], []).append(j)
    conts = [c for c, js in by_cont.items() if len(js) >= per]
    e1 = e2 = chain = flat_same = 0
    eligible = [j for j, r in enumerate(rows) if r[2] in conts]
    qs = rng.choice(eligible, size=min(cfg.llm_questions, len(eligible)), replace=False)
    for q in qs:
        country, cap, cont = rows[q]
        other = rng.choice([c for c in conts if c != cont], size=deg - 1, replace=False).tolist()
        cands = {cont: [q, *rng.choice([j for j in by_cont[cont] if j != q], size=per - 1, replace=False).tolist()]}
        for c in other:
            cands[c] = rng.choice(by_cont[c], size=per, replace=False).tolist()
        order = [cont, *other]
        s1 = ctx.llm.continuation_logprobs(f"{country} is a country in", [" " + c for c in order])
        step1_ok = _pick(s1) == 0
        chosen = order[_pick(s1)]
        s2 = ctx.llm.continuation_logprobs(f"The capital of {country} is", [" " + caps[j] for j in cands[chosen]])
        # step-2 error is measured on the true continent's block (teacher-forced), as in the paper's
        # per-step ε; the chain outcome uses the model's own step-1 choice.
        s2_true = s2 if step1_ok else ctx.llm.continuation_logprobs(
            f"The capital of {country} is", [" " + caps[j] for j in cands[cont]])
        step2_ok = cands[cont][_pick(s2_true)] == q
        e1 += not step1_ok
        e2 += not step2_ok
        chain += not (step1_ok and cands[chosen][_pick(s2)] == q)
        all_c = [j for c in order for j in cands[c]]
        sf = ctx.llm.continuation_logprobs(f"The capital of {country} is", [" " + caps[j] for j in all_c])
        flat_same += all_c[_pick(sf)] != q
    n = len(qs)
    tree = {"k": k, "degree": deg, "questions": n, "step1_error": e1 / n, "step2_error": e2 / n,
            "chain_error": chain / n, "flat_error_same_candidates": flat_same / n,
            "independent_prediction": 1 - (1 - e1 / n) * (1 - e2 / n)}
    out: dict[str, Any] = {"flat": flat, "tree": tree}
    ks = np.array([int(x) for x in flat])
    errs_arr = np.array([flat[x]["error"] for x in flat])
    ok = errs_arr > 0
    if ok.sum() >= 2:
        slope, _ = np.polyfit(np.log(ks[ok]), np.log(errs_arr[ok]), 1)
        out["loglog_alpha"] = float(slope)
    return out


def _two_hop_arm(ctx: RunContext, cfg: Config, rng: np.random.Generator) -> dict[str, Any]:
    """Two-hop questions with a known tree: "on which continent is the country whose capital is
    C?" (capital → country → continent). Direct: the continent is scored right after the question.
    Step by step: the model first states the country (its own most likely choice among the true one
    and hop_k − 1 others), then the continent is scored with that statement in the prompt; step 2
    is also scored after the true country (teacher forced), the per-step error of the chain."""
    rows = load_capitals()
    continents = sorted({r[2] for r in rows})
    options = [" " + c for c in continents]
    direct_err = chain_err = e1 = e2 = 0
    items = []
    for i in range(cfg.hop_questions):
        if i % 4 == 0:
            ctx.progress(0.9 + 0.08 * i / cfg.hop_questions, "served model: two-hop questions")
        q = int(rng.integers(len(rows)))
        country, cap, cont = rows[q]
        cands = [q, *rng.choice([j for j in range(len(rows)) if j != q], size=cfg.hop_k - 1, replace=False).tolist()]
        truth = continents.index(cont)
        direct = _pick(ctx.llm.continuation_logprobs(f"The country whose capital is {cap} is on the continent of",
                                                     options))
        step1 = _pick(ctx.llm.continuation_logprobs(f"{cap} is the capital of", [" " + rows[j][0] for j in cands]))
        said = rows[cands[step1]][0]
        chain = _pick(ctx.llm.continuation_logprobs(f"{cap} is the capital of {said}. {said} is on the continent of",
                                                    options))
        step2 = chain if step1 == 0 else _pick(ctx.llm.continuation_logprobs(
            f"{cap} is the capital of {country}. {country} is on the continent of", options))
        direct_err += direct != truth
        chain_err += chain != truth
        e1 += step1 != 0
        e2 += step2 != truth
        items.append({"capital": cap, "candidates": [rows[j][0] for j in cands], "direct": continents[direct],
                      "said": said, "chain": continents[chain]})
    n = cfg.hop_questions
    ctx.record_data("two_hop_questions", json.dumps(items))
    return {"questions": n, "step1_options": cfg.hop_k, "answer_options": len(continents),
            "chance_error": 1 - 1 / len(continents), "direct_error": direct_err / n, "chain_error": chain_err / n,
            "step1_error": e1 / n, "step2_error": e2 / n, "independent_prediction": 1 - (1 - e1 / n) * (1 - e2 / n)}


Config.METHODS = {
    "trained": Method("the sphere and tree classifiers trained on fresh samples", train_for),
    "null": Method("the sphere and tree classifiers are left at their random initialisation", leave_untrained),
}


@register_suite("powerlaw-cot", version=3, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    set_threads(1)
    cfg = config
    rng = np.random.default_rng(seed)
    ctx.progress(0.01, "closed forms")
    checks, reference = _theory_checks(rng)
    metrics: dict[str, Any] = {"sphere": {}}
    claims: list[Claim] = []

    n_runs = len(cfg.dims) * len(cfg.classes)
    done = 0
    curves = {}
    for d in cfg.dims:
        errs = []
        for m in cfg.classes:
            ctx.progress(0.05 + 0.35 * done / n_runs, f"sphere d={d} m={m}")
            errs.append(_sphere_error(d, m, cfg, seed * 1000 + d * 10007 + m))
            done += 1
        ms = np.array(cfg.classes, float)
        e = np.array(errs)
        fixed = fit_power_law(ms, e, 2 / d)
        free = fit_power_law(ms, e, None)
        curves[d] = e
        metrics["sphere"][f"d{d}"] = {"errors": dict(zip(map(str, cfg.classes), errs, strict=True)),
                                      "fit_fixed_2_over_d": fixed, "fit_free": free}
        # an untrained net errs at chance, 1 − 1/m; a trained one must sit far below it at every m
        share = max(err / (1 - 1 / m) for err, m in zip(errs, cfg.classes, strict=True))
        checks.append(check_cmp(f"sphere_classifier_beats_chance_d{d}", "gate", share, "<=",
                                cfg.max_error_share_of_chance, "max over m of test error / chance error"))
        claims.append(claim(f"sphere_power_law_d{d}", "error grows as ε = a·m^{2/d} + b in the number of classes",
                            fixed["r2"], ">=", 0.9, "R² of the fit with the exponent fixed at 2/d"))
        claims.append(claim(f"sphere_error_increases_with_m_d{d}", "more classes → higher error",
                            errs[-1] - errs[0], ">", 0.0, f"ε(m={cfg.classes[-1]}) − ε(m={cfg.classes[0]})"))
        claims.append(claim(f"sphere_free_exponent_near_2_over_d_d{d}", "the fitted exponent is the theory's 2/d",
                            abs(free["alpha"] - 2 / d) / (2 / d), "<=", 0.5,
                            f"|α_free − 2/d| / (2/d), α_free = {free['alpha']:.3f}, 2/d = {2 / d:.3f}"))
    if len(cfg.dims) >= 2:
        lo, hi = min(cfg.dims), max(cfg.dims)
        # the paper's exponent is 2/d: the free-exponent fit should flatten as d grows
        a_lo = metrics["sphere"][f"d{lo}"]["fit_free"]["alpha"]
        a_hi = metrics["sphere"][f"d{hi}"]["fit_free"]["alpha"]
        claims.append(claim("sphere_free_exponent_decreases_with_d", "the error exponent 2/d falls with d",
                            a_lo - a_hi, ">", 0.0, f"free-fit α(d={lo}) − α(d={hi})"))

    c, cl, metrics["tree"] = _tree_arm(ctx, cfg, seed)
    checks += c
    claims += cl

    uses_llm = bool(cfg.llm_ks) or cfg.hop_questions > 0
    if cfg.llm_ks:
        arm = _llm_arm(ctx, cfg, rng)
        metrics["served"] = arm
        errs_k = [arm["flat"][str(k)]["error"] for k in cfg.llm_ks]
        claims.append(claim("served_error_grows_with_K", "the served model errs more with more options",
                            errs_k[-1] - errs_k[0], ">", 0.0, f"ε(K={cfg.llm_ks[-1]}) − ε(K={cfg.llm_ks[0]})"))
        t = arm["tree"]
        claims.append(claim("served_tree_chain_not_worse_than_flat", "decomposing (continent → capital) does not "
                            "hurt at equal K", t["flat_error_same_candidates"] - t["chain_error"], ">=", 0.0,
                            "flat error − chain error on the same candidates"))
        metrics["served_headline_error_at_max_K"] = errs_k[-1]
    if cfg.hop_questions > 0:
        hop = _two_hop_arm(ctx, cfg, rng)
        metrics["served_two_hop"] = hop
        claims.append(claim("served_two_hop_steps_beat_direct", "stating the intermediate hop first lowers the error "
                            "of a two-hop question", hop["direct_error"] - hop["chain_error"], ">", 0.0,
                            f"direct error − step-by-step error over {hop['questions']} questions "
                            f"(capital → country among {hop['step1_options']} → continent)"))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for d, e in curves.items():
        ax.plot(cfg.classes, e, "o-", label=f"sphere d={d}")
    if cfg.llm_ks:
        ax.plot(cfg.llm_ks, [metrics["served"]["flat"][str(k)]["error"] for k in cfg.llm_ks], "s--",
                label="served cloze")
    ax.set_xscale("log")
    ax.set_xlabel("number of classes")
    ax.set_ylabel("error")
    ax.legend(fontsize=7)
    ctx.save_figure("powerlaw_error_vs_classes.png", fig)
    reference.update({"alpha_theory": {f"d{d}": 2 / d for d in cfg.dims},
                      "paper_fitted_exponents": "not published in the code; paper figures unreachable",
                      "verified_against_paper": False})
    ctx.save_json("powerlaw_cot_metrics.json", metrics)
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims, uses_llm=uses_llm)
