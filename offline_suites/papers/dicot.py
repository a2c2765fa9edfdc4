"""dicot: Di-COT, "Divide and Contrast" self-supervised learning for time series (Shamba, Bach, Taylor;
arXiv 2605.21241; code sfi-norwai/Di-COT — reimplemented from the paper's description, no code copied).

Each iteration redraws a sub-block partition of every window (n ~ U{2..10} blocks at overlap p = 0.5:
block length L = T / (1 + (n−1)(1−p)) rounded to an even integer, stride s = round(L(1−p)), m = ⌊(T−L)/s⌋
+ 1 blocks taken as a strided view, no copies); all B·m blocks go through an InceptionTime encoder in one
pass; within each window the similarity S = ZZᵀ/τ (τ = 0.07, embeddings not normalised, as in the code)
feeds a cross-entropy whose positive for block k is its predecessor k−1 (block 0: itself) and whose
negatives are the window's other blocks, so the loss costs O(B·m²), independent of T. The frozen encoder's
pooled features are scored by a linear probe (StandardScaler + one-vs-rest logistic regression). Against a
randomly initialised encoder with the same probe (the paper's control) and a TS2Vec-style baseline
(hierarchical instance + temporal contrast on two overlapping random crops) with the same encoder, on UCR/UEA
sets shipped in the aeon wheel (read by our own .ts parser; aeon's code is never imported).
The null method leaves the Di-COT encoder untrained.
"""

from __future__ import annotations

import importlib.util
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
    datasets: tuple[str, ...] = ("ArrowHead",)
    seeds: int = 1
    iterations: int = 40
    batch: int = 8
    lr: float = 3e-4
    weight_decay: float = 3e-4
    temperature: float = 0.07
    overlap: float = 0.5
    max_blocks: int = 10
    filters: int = 12                 # per Inception branch (4 branches); the paper uses 32 with 128 channels
    out_dim: int = 64
    modules: int = 3                  # Inception modules (one residual block)
    max_length: int = 128             # longer series are linearly resampled to this length (CPU budget)
    gate_loss_ratio: float = 0.8      # held-out Di-COT loss after training ≤ this × before
    method: str = "dicot"            # a name in METHODS; "null" is the untrained model
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "seeds": (1, 20), "iterations": (0, 100_000), "batch": (2, 1024), "lr": (1e-6, 1.0),
        "weight_decay": (0.0, 1.0), "temperature": (1e-3, 10.0), "overlap": (0.0, 0.9), "max_blocks": (2, 64),
        "filters": (2, 256), "out_dim": (2, 1024), "modules": (1, 12), "max_length": (16, 10_000),
        "gate_loss_ratio": (0.0, 10.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(run_seeds=3, datasets=("ArrowHead", "OSULeaf", "BasicMotions"), seeds=2, iterations=150)


# ------------------------------------------------------------------------------------------ data
def ucr_path(name: str, split: str) -> Path:
    spec = importlib.util.find_spec("aeon")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the aeon wheel (UCR/UEA data files) is not installed: scripts/install.sh suites, "
                           "or pip install --no-deps aeon==1.6.0")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / name / f"{name}_{split}.ts"


def read_ts(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A .ts file with equal-length series: (n, channels, length) float64 and string labels."""
    xs, ys, in_data = [], [], False
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            in_data = line.lower() == "@data"
            continue
        *dims, label = line.split(":")
        xs.append([[float(v) for v in d.split(",")] for d in dims])
        ys.append(label.strip())
    return np.asarray(xs, dtype=np.float64), np.asarray(ys)


def load(ctx: RunContext, name: str, max_length: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for split in ("TRAIN", "TEST"):
        p = ucr_path(name, split)
        ctx.record_data(f"aeon_{name}_{split}", p.read_bytes())
        x, y = read_ts(p)
        if x.shape[2] > max_length:
            grid = np.linspace(0, x.shape[2] - 1, max_length)
            x = np.stack([[np.interp(grid, np.arange(x.shape[2]), c) for c in s] for s in x])
        out[f"x_{split.lower()}"], out[f"y_{split.lower()}"] = x, y
    return out


# -------------------------------------------------------------------------------------- sampler
def partition(length: int, n: int, overlap: float) -> tuple[int, int, int]:
    """(L, s, m) of the Di-COT sub-block partition of a window of ``length`` into ~n blocks."""
    raw = length / (1 + (n - 1) * (1 - overlap))
    blk = max(2, 2 * round(raw / 2))
    stride = max(1, round(blk * (1 - overlap)))
    return blk, stride, (length - blk) // stride + 1


def blocks_view(x: Any, blk: int, stride: int) -> Any:
    """(B, C, T) → (B, m, C, L) strided view sharing storage with x."""
    return x.unfold(2, blk, stride).permute(0, 2, 1, 3)


# -------------------------------------------------------------------------------------- encoder
def make_encoder(channels: int, cfg: Config) -> Any:
    import torch
    from torch import nn

    class Inception(nn.Module):
        def __init__(self, c_in: int, nf: int) -> None:
            super().__init__()
            self.bottleneck = nn.Conv1d(c_in, nf, 1, bias=False)
            self.convs = nn.ModuleList([nn.Conv1d(nf, nf, k, padding=k // 2, bias=False) for k in (9, 19, 39)])
            self.pool = nn.Sequential(nn.MaxPool1d(3, 1, 1), nn.Conv1d(c_in, nf, 1, bias=False))
            self.bn = nn.BatchNorm1d(4 * nf)

        def forward(self, x: Any) -> Any:
            b = self.bottleneck(x)
            return torch.relu(self.bn(torch.cat([c(b) for c in self.convs] + [self.pool(x)], 1)))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            width = 4 * cfg.filters
            self.inp = nn.Conv1d(channels, width, 1)     # the paper's input linear map C → width
            self.mods = nn.ModuleList([Inception(width, cfg.filters) for _ in range(cfg.modules)])
            self.head = nn.Linear(width, cfg.out_dim)

        def sequence(self, x: Any) -> Any:
            """Per-timestep features (B, width, T); residual connection around every 3 modules."""
            h = self.inp(x)
            res = h
            for i, m in enumerate(self.mods):
                h = m(h)
                if i % 3 == 2:
                    h = torch.relu(h + res)
                    res = h
            return h

        def forward(self, x: Any) -> Any:
            return self.head(self.sequence(x).mean(2))

    return Encoder()


def dicot_loss(z: Any, temperature: float) -> Any:
    """z: (B, m, d). Positive of block k is block k−1 (block 0: itself); other blocks are negatives."""
    import torch

    _, m, _ = z.shape
    s = z @ z.transpose(1, 2) / temperature
    eye = torch.eye(m, dtype=torch.bool)
    eye[0, 0] = False                          # block 0's positive is itself, so its diagonal stays
    s = s.masked_fill(eye[None], float("-inf"))
    target = torch.clamp(torch.arange(m) - 1, min=0)
    return torch.nn.functional.cross_entropy(s.reshape(-1, m), target.repeat(z.shape[0]))


def dicot_step_loss(enc: Any, x: Any, n: int, cfg: Config) -> Any:
    blk, stride, m = partition(x.shape[2], n, cfg.overlap)
    v = blocks_view(x, blk, stride)
    z = enc(v.reshape(-1, x.shape[1], blk)).reshape(x.shape[0], m, -1)   # one encoder pass for all B·m blocks
    return dicot_loss(z, cfg.temperature)


def ts2vec_loss(enc: Any, x: Any, g: Any) -> Any:
    """TS2Vec-style hierarchical contrast: two random crops sharing an overlap, per-timestep features
    of the overlap contrasted across instances (same time) and across time (same instance), then max-
    pooled by 2 and contrasted again until one step is left."""
    import torch
    import torch.nn.functional as F

    t = x.shape[2]
    crop = int(torch.randint(max(4, t // 4), t + 1, (1,), generator=g))
    a1 = int(torch.randint(0, t - crop + 1, (1,), generator=g))
    b1 = a1 + crop
    a2 = int(torch.randint(0, a1 + 1, (1,), generator=g))
    b2 = int(torch.randint(b1, t + 1, (1,), generator=g))
    h1 = enc.sequence(x[:, :, a2:b1])[:, :, a1 - a2:]
    h2 = enc.sequence(x[:, :, a1:b2])[:, :, :crop]
    z1, z2 = h1.transpose(1, 2), h2.transpose(1, 2)                        # (B, T', d)
    loss, depth = z1.new_zeros(()), 0
    while True:
        b, tt, _ = z1.shape
        if b > 1:                                                          # instance contrast
            z = torch.cat([z1, z2], 0).transpose(0, 1)                     # (T', 2B, d)
            sim = z @ z.transpose(1, 2)
            sim = sim.masked_fill(torch.eye(2 * b, dtype=torch.bool)[None], float("-inf"))
            tgt = torch.cat([torch.arange(b, 2 * b), torch.arange(b)])
            loss = loss + F.cross_entropy(sim.reshape(-1, 2 * b), tgt.repeat(tt))
        if tt > 1:                                                         # temporal contrast
            z = torch.cat([z1, z2], 1)                                     # (B, 2T', d)
            sim = z @ z.transpose(1, 2)
            sim = sim.masked_fill(torch.eye(2 * tt, dtype=torch.bool)[None], float("-inf"))
            tgt = torch.cat([torch.arange(tt, 2 * tt), torch.arange(tt)])
            loss = loss + F.cross_entropy(sim.reshape(-1, 2 * tt), tgt.repeat(b))
        depth += 1
        if tt <= 1:
            return loss / depth
        z1 = F.max_pool1d(z1.transpose(1, 2), 2).transpose(1, 2)
        z2 = F.max_pool1d(z2.transpose(1, 2), 2).transpose(1, 2)


def train(kind: str, x: np.ndarray, cfg: Config, seed: int) -> tuple[Any, float]:
    """The trained encoder and the training FLOPs (forward and backward, counted by torch: a cost
    measure that, unlike wall time, is the same on every run)."""
    import torch

    torch.manual_seed(seed)
    enc = make_encoder(x.shape[1], cfg)
    g = torch.Generator().manual_seed(seed)
    xt = torch.tensor(x, dtype=torch.float32)
    its = 0 if kind == "random_init" else method_impl(cfg)(cfg.iterations) if kind == "dicot" else cfg.iterations
    opt = torch.optim.AdamW(enc.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    warm = max(1, its // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: (i + 1) / warm if i < warm else 0.5 * (1 + math.cos(math.pi * (i - warm) / max(1, its - warm))))
    from torch.utils.flop_counter import FlopCounterMode

    enc.train()
    counter = FlopCounterMode(display=False)
    with counter:
        _train_loop(kind, enc, xt, opt, sched, its, cfg, g)
    return enc.eval(), float(counter.get_total_flops())


def _train_loop(kind: str, enc: Any, xt: Any, opt: Any, sched: Any, its: int, cfg: Config, g: Any) -> None:
    import torch

    for _ in range(its):
        j = torch.randperm(len(xt), generator=g)[:cfg.batch]
        if kind == "dicot":
            n = int(torch.randint(2, cfg.max_blocks + 1, (1,), generator=g))
            loss = dicot_step_loss(enc, xt[j], n, cfg)
        else:
            loss = ts2vec_loss(enc, xt[j], g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def features(enc: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return np.concatenate([enc(torch.tensor(x[i:i + 64], dtype=torch.float32)).numpy()
                               for i in range(0, len(x), 64)]).astype(np.float64)


def probe(ftr: np.ndarray, ytr: np.ndarray, fte: np.ndarray, yte: np.ndarray) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), OneVsRestClassifier(LogisticRegression(max_iter=2000)))
    clf.fit(ftr, ytr)
    return float(np.mean(clf.predict(fte) == yte))


def heldout_loss(enc: Any, x: np.ndarray, cfg: Config) -> float:
    """Di-COT loss on test windows over fixed partitions n = 2…max_blocks (no randomness)."""
    import torch

    xt = torch.tensor(x[:64], dtype=torch.float32)
    with torch.no_grad():
        return float(np.mean([float(dicot_step_loss(enc, xt, n, cfg)) for n in range(2, cfg.max_blocks + 1)]))


# -------------------------------------------------------------------------------------- checks
def sampler_checks(cfg: Config, rng: np.random.Generator) -> tuple[list[Check], dict[str, Any]]:
    import torch

    checks: list[Check] = [check_equal("partition_paper_example", "gate", [50, 25, 5], list(partition(150, 5, 0.5)),
                                       "T = 150, n = 5, p = 0.5 → L = 50, s = 25, m = 5")]
    bad: list[str] = []
    for _ in range(300):
        t = int(rng.integers(20, 5000))
        n = int(rng.integers(2, 11))
        for p in (cfg.overlap, 0.0):
            blk, s, m = partition(t, n, p)
            starts = [k * s for k in range(m)]
            if blk % 2 or blk > t or starts[-1] + blk > t or t - (starts[-1] + blk) >= s:
                bad.append(f"T={t} n={n} p={p}: L={blk} s={s} m={m} (length, end or uncovered tail ≥ s)")
            if p == 0.0 and s != blk:
                bad.append(f"T={t} n={n}: p = 0 must give disjoint blocks (s = L), got s={s} L={blk}")
            if p > 0 and abs((blk - s) / blk - p) > 1.0 / blk + 1e-9:
                bad.append(f"T={t} n={n}: overlap share {(blk - s) / blk:.3f} ≠ p={p}")
    checks.append(check_equal("partition_invariants_300_draws", "gate", [], bad[:5],
                              "even length L ≤ T; blocks inside the window; uncovered tail < stride; p = 0 → "
                              "disjoint, tiling blocks; overlap share = p to rounding"))
    # the strided view is exact and copy-free, and p = 0 tiles the window: concatenating blocks returns it
    x = torch.randn(3, 2, 120)
    v = blocks_view(x, *partition(120, 4, 0.0)[:2])
    checks.append(check_equal("blocks_view_shares_storage_and_tiles", "gate", [True, True],
                              [v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
                               bool(torch.equal(v.permute(0, 2, 1, 3).reshape(3, 2, -1), x))]))
    # the loss's cost does not grow with T: FLOPs of the loss counted by torch for T = 10², 10³, 10⁴
    # (wall time would make two runs of the same seed differ)
    from torch.utils.flop_counter import FlopCounterMode

    flops, shapes = {}, {}
    for t in (100, 1000, 10_000):
        blk, s, m = partition(t, cfg.max_blocks, cfg.overlap)
        z = torch.randn(cfg.batch, m, cfg.out_dim)
        counter = FlopCounterMode(display=False)
        with counter:
            dicot_loss(z, cfg.temperature)
        flops[t], shapes[t] = int(counter.get_total_flops()), m
    ratio = max(flops.values()) / max(min(flops.values()), 1)
    checks.append(check_cmp("loss_similarity_size_bounded_in_T", "gate", max(shapes.values()), "<=", cfg.max_blocks,
                            "largest m for n = max_blocks at T = 10², 10³, 10⁴: S is (B, m, m) whatever T"))
    checks.append(check_equal("loss_flops_are_2Bm2d", "gate",
                              [2 * cfg.batch * shapes[t] ** 2 * cfg.out_dim for t in (100, 1000, 10_000)],
                              [flops[t] for t in (100, 1000, 10_000)],
                              "FLOPs torch counts for the loss at T = 10², 10³, 10⁴: the similarity ZZᵀ and "
                              "nothing that scales with T"))
    return checks, {"loss_flops": flops, "blocks": shapes, "loss_flops_ratio": ratio}


Config.METHODS = {
    "dicot": Method("the Di-COT encoder trained with its sub-block predecessor contrast", train_for),
    "null": Method("the Di-COT encoder is left at its random initialisation", leave_untrained),
}


@register_suite("dicot", version=1, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    set_threads(1)
    rng = np.random.default_rng(seed)
    checks, unit = sampler_checks(config, rng)
    ctx.progress(0.05, "sampler and loss checks")
    arms = ("dicot", "random_init", "ts2vec")
    per: dict[str, list[dict[str, Any]]] = {d: [] for d in config.datasets}
    total = len(config.datasets) * config.seeds
    for i, name in enumerate(config.datasets):
        data = load(ctx, name, config.max_length)
        for s in range(config.seeds):
            ctx.progress(0.05 + 0.9 * (i * config.seeds + s) / total, f"{name} seed {s}")
            row: dict[str, Any] = {}
            for arm in arms:
                enc, flops = train(arm, data["x_train"], config, seed * 1000 + s)
                acc = probe(features(enc, data["x_train"]), data["y_train"], features(enc, data["x_test"]),
                            data["y_test"])
                row[arm] = {"accuracy": acc, "train_flops": flops}
                if arm != "ts2vec":
                    row[arm]["heldout_loss"] = heldout_loss(enc, data["x_test"], config)
            row["params"] = sum(p.numel() for p in enc.parameters())
            row["classes"] = len(np.unique(data["y_train"]))
            per[name].append(row)
    mean = {d: {a: {k: float(np.mean([r[a][k] for r in rows])) for k in rows[0][a]} for a in arms}
            for d, rows in per.items()}
    claims: list[Claim] = []
    for d, m in mean.items():
        ratio = m["dicot"]["heldout_loss"] / m["random_init"]["heldout_loss"]
        checks.append(check_cmp(f"{d}_dicot_training_lowers_heldout_loss", "gate", ratio, "<=", config.gate_loss_ratio,
                                "Di-COT loss on test windows, trained encoder / random-init encoder (same seed)"))
        n_cls = per[d][0]["classes"]
        checks.append(check_cmp(f"{d}_dicot_probe_beats_chance", "sanity", m["dicot"]["accuracy"], ">", 1 / n_cls))
        claims.append(claim(f"{d}_dicot_beats_random_init", "Di-COT beats the random-init encoder by a clear margin "
                            "(≥ 5 points)", m["dicot"]["accuracy"] - m["random_init"]["accuracy"], ">=", 0.05,
                            "linear-probe accuracy difference"))
        claims.append(claim(f"{d}_dicot_at_least_ts2vec", "Di-COT's accuracy matches or beats TS2Vec",
                            m["dicot"]["accuracy"] - m["ts2vec"]["accuracy"], ">=", 0.0, "accuracy difference"))
        claims.append(claim(f"{d}_dicot_trains_cheaper_than_ts2vec", "Di-COT trains about 2.5× cheaper than TS2Vec "
                            "(the paper's training-time ratio, measured here as training FLOPs)",
                            m["ts2vec"]["train_flops"] / max(m["dicot"]["train_flops"], 1.0), ">=", 2.5,
                            "FLOP ratio TS2Vec / Di-COT at equal iterations and batch; 1 = no saving",
                            no_effect=1.0))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(mean), 3.0))
    for j, d in enumerate(mean):
        for k, arm in enumerate(arms):
            ax.bar(j * 4 + k, mean[d][arm]["accuracy"], color=f"C{k}", label=arm if j == 0 else None)
    ax.set_xticks([j * 4 + 1 for j in range(len(mean))], list(mean), fontsize=8)
    ax.set_ylabel("linear-probe accuracy")
    ax.legend(fontsize=7)
    ctx.save_figure("dicot_probe_accuracy.png", fig)
    metrics: dict[str, Any] = {"mean": mean, "per_seed": per, "unit": unit,
                               "headline_gain_vs_random_init": {d: m["dicot"]["accuracy"] - m["random_init"]["accuracy"]
                                                                for d, m in mean.items()}}
    ctx.save_json("dicot_metrics.json", metrics)
    reference = {"research_prototype_200_iterations": {"ArrowHead": {"random_init": [0.674, 0.697], "dicot": [0.840, 0.806]},
                                                       "OSULeaf": {"random_init": [0.686, 0.657], "dicot": [0.855, 0.835]},
                                                       "BasicMotions": {"random_init": [1.0, 1.0], "dicot": [1.0, 1.0]}},
                 "abstract": "state-of-the-art accuracy with substantially less training time (~2.5× faster per a "
                             "third-party summary)", "verified_against_paper": False}
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims)
