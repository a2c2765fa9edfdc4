"""bicrossnet: few-shot recognition of custom IMU gestures with a BiCrossNet-style extractor and decoupled
dual generators (ICML 2026 poster; no paper text or code was reachable, rebuilt from the abstract).

The extractor has an accelerometer and a gyroscope branch (1-D convolutions) joined by bidirectional
cross-attention (each stream queries the other), pooled into one embedding and pre-trained on base
gestures. Two generators augment the few shots of a new gesture: a *delta-generator* (Δ-encoder idea: an
encoder maps a same-class pair of base signals to a small delta, a decoder applies a delta to another
signal) synthesises extra training signals, and an *embedding-generator* (distribution calibration:
the new class's embedding distribution borrows mean and covariance from its nearest base classes) samples
extra embeddings. Arms on N-way K-shot episodes: extractor + generators + a linear (ridge) classifier, the same
without generators, and a prototype baseline (nearest class mean on a single-stream CNN of similar size).
Data: synthetic 6-axis IMU gestures (3-D stroke trajectories → accelerometer = rotated second derivative
plus gravity, gyroscope = rotated wrist angular rate) whose per-user nuisance (amplitude, time warp, sensor
rotation) is shared across classes by construction, and aeon's BasicMotions (real watch accelerometer +
gyroscope). The null method leaves the extractor and both generators untrained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    base_classes: int = 16
    novel_classes: int = 8
    per_class: int = 30
    length: int = 64                  # samples per gesture (50 Hz)
    ways: int = 5
    shots: tuple[int, ...] = (1, 5)
    queries: int = 10
    episodes: int = 60
    channels: int = 24                # per stream
    embed: int = 48
    delta_dim: int = 5                # about the nuisance's degrees of freedom (amplitude, warp, 3-D rotation)
    generated: int = 10               # synthetic signals and embeddings per shot
    epochs: int = 15                  # extractor pre-training
    delta_steps: int = 600            # delta-generator training steps
    lr: float = 2e-3
    min_base_accuracy: float = 0.7    # extractor on held-out base gestures (chance 1/base_classes)
    max_delta_error_ratio: float = 0.6  # reconstruction error of D(E(a, b), b) vs a, over ‖a − b‖²
    method: str = "bicrossnet"       # a name in METHODS; "null" is the untrained model
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "base_classes": (2, 500), "novel_classes": (2, 100), "per_class": (4, 2000), "length": (16, 1024),
        "ways": (2, 50), "shots": (1, 100), "queries": (1, 500), "episodes": (1, 100_000), "channels": (2, 512),
        "embed": (2, 1024), "delta_dim": (1, 256), "generated": (0, 1000), "epochs": (0, 10_000),
        "delta_steps": (0, 100_000), "lr": (1e-6, 1.0), "min_base_accuracy": (0.0, 1.0),
        "max_delta_error_ratio": (0.0, 10.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(run_seeds=3, base_classes=40, novel_classes=10, per_class=60, episodes=600, channels=32, embed=64,
                     epochs=40, delta_steps=3000)

ARMS = ("bicrossnet_dual_gen", "bicrossnet_no_gen", "bicrossnet_delta_only", "bicrossnet_embed_only",
        "prototype_cnn")


# ------------------------------------------------------------------------------------------ data
def _rotation(rng: np.random.Generator, max_deg: float) -> np.ndarray:
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    a = math.radians(rng.uniform(-max_deg, max_deg))
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + math.sin(a) * k + (1 - math.cos(a)) * k @ k


def gesture_classes(n: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Each class: Fourier coefficients of a 3-D stroke and of a wrist rotation angle, and a rotation axis."""
    return [{"pos": rng.normal(0, 1, (3, 3, 2)) / np.arange(1, 4)[None, :, None],
             "rot": rng.normal(0, 1, (3, 2)) / np.arange(1, 4)[:, None],
             "axis": (lambda v: v / np.linalg.norm(v))(rng.normal(size=3))} for _ in range(n)]


def render(cls: dict[str, np.ndarray], length: int, rng: np.random.Generator) -> np.ndarray:
    """One recording (6, length): a user's amplitude, time warp and sensor rotation, plus sensor noise."""
    amp, gamma, rot = rng.uniform(0.7, 1.3), rng.uniform(0.8, 1.2), _rotation(rng, 20.0)
    t = np.linspace(0, 1, length) ** gamma
    dt = 1.0 / 50
    k = np.arange(1, 4)[:, None] * 2 * np.pi * t[None]
    pos = amp * np.einsum("ckj,jkt->ct", cls["pos"], np.stack([np.sin(k), np.cos(k)]))      # (3, T)
    acc = np.gradient(np.gradient(pos, dt, axis=1), dt, axis=1) / 50.0 + np.array([[0], [0], [1.0]])
    ang = amp * np.einsum("kj,jkt->t", cls["rot"], np.stack([np.sin(k), np.cos(k)]))
    gyro = np.gradient(ang, dt)[None] * cls["axis"][:, None] / 10.0
    sig = np.concatenate([rot.T @ acc, rot.T @ gyro])
    return sig + 0.05 * rng.normal(size=sig.shape)


def synthetic(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    classes = gesture_classes(cfg.base_classes + cfg.novel_classes, rng)
    x = np.stack([render(c, cfg.length, rng) for c in classes for _ in range(cfg.per_class)])
    y = np.repeat(np.arange(len(classes)), cfg.per_class)
    return {"x": x, "y": y}


def basic_motions(ctx: RunContext, length: int) -> dict[str, np.ndarray]:
    from offline_suites.papers.dicot import read_ts, ucr_path

    xs, ys = [], []
    for split in ("TRAIN", "TEST"):
        p = ucr_path("BasicMotions", split)
        ctx.record_data(f"aeon_BasicMotions_{split}", p.read_bytes())
        x, y = read_ts(p)
        xs.append(x)
        ys.append(y)
    x, labels = np.concatenate(xs), np.concatenate(ys)
    grid = np.linspace(0, x.shape[2] - 1, length)
    x = np.stack([[np.interp(grid, np.arange(x.shape[2]), c) for c in s] for s in x])
    _, y = np.unique(labels, return_inverse=True)
    return {"x": x, "y": y}


# ---------------------------------------------------------------------------------------- models
def make_bicrossnet(cfg: Config, n_classes: int) -> Any:
    import torch
    from torch import nn

    def branch() -> Any:
        c = cfg.channels
        return nn.Sequential(nn.Conv1d(3, c, 5, padding=2), nn.BatchNorm1d(c), nn.ReLU(), nn.MaxPool1d(2),
                             nn.Conv1d(c, c, 5, padding=2), nn.BatchNorm1d(c), nn.ReLU(), nn.MaxPool1d(2))

    class BiCross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.acc, self.gyro = branch(), branch()
            self.a2g = nn.MultiheadAttention(cfg.channels, 2, batch_first=True)
            self.g2a = nn.MultiheadAttention(cfg.channels, 2, batch_first=True)
            self.proj = nn.Linear(2 * cfg.channels, cfg.embed)
            self.head = nn.Linear(cfg.embed, n_classes)

        def embed(self, x: Any) -> Any:
            a = self.acc(x[:, :3]).transpose(1, 2)
            g = self.gyro(x[:, 3:]).transpose(1, 2)
            a2 = a + self.a2g(a, g, g, need_weights=False)[0]    # accelerometer queries gyroscope
            g2 = g + self.g2a(g, a, a, need_weights=False)[0]    # and the other way round
            return torch.relu(self.proj(torch.cat([a2.mean(1), g2.mean(1)], 1)))

        def forward(self, x: Any) -> Any:
            return self.head(self.embed(x))

    return BiCross()


def make_cnn(cfg: Config, n_classes: int) -> Any:
    """Single-stream baseline extractor: both sensors stacked as 6 channels, no cross-attention."""
    import torch
    from torch import nn

    c = 2 * cfg.channels

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv1d(6, c, 5, padding=2), nn.BatchNorm1d(c), nn.ReLU(), nn.MaxPool1d(2),
                                      nn.Conv1d(c, c, 5, padding=2), nn.BatchNorm1d(c), nn.ReLU(), nn.MaxPool1d(2))
            self.proj = nn.Linear(c, cfg.embed)
            self.head = nn.Linear(cfg.embed, n_classes)

        def embed(self, x: Any) -> Any:
            return torch.relu(self.proj(self.body(x).mean(2)))

        def forward(self, x: Any) -> Any:
            return self.head(self.embed(x))

    return CNN()


def n_params(net: Any) -> int:
    """Feature-extractor parameters (the classification head over base classes excluded)."""
    return sum(p.numel() for n, p in net.named_parameters() if not n.startswith("head."))


def pretrain(make: Any, x: np.ndarray, y: np.ndarray, cfg: Config, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)             # before construction: the initial weights are part of the run
    net = make(cfg, int(y.max()) + 1)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    g = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(method_impl(cfg)(cfg.epochs)):
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), 64):
            j = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(net(xt[j]), yt[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


class DeltaGenerator:
    """Δ-encoder on flattened signals: E(a, b) → δ (small), D(δ, b) → â. Trained on same-class base
    pairs; at use, a delta from a random base pair is applied to a new class's shot."""

    def __init__(self, dim: int, cfg: Config, seed: int) -> None:
        import torch
        from torch import nn

        torch.manual_seed(seed)

        self.enc = nn.Sequential(nn.Linear(2 * dim, 256), nn.ReLU(), nn.Linear(256, cfg.delta_dim))
        self.dec = nn.Sequential(nn.Linear(cfg.delta_dim + dim, 256), nn.ReLU(), nn.Linear(256, dim))

    def reconstruct(self, a: Any, b: Any) -> Any:
        import torch

        return b + self.dec(torch.cat([self.enc(torch.cat([a, b], 1)), b], 1))

    def train(self, x: np.ndarray, y: np.ndarray, cfg: Config, seed: int) -> None:
        import torch

        params = list(self.enc.parameters()) + list(self.dec.parameters())
        opt = torch.optim.Adam(params, lr=cfg.lr)
        rng = np.random.default_rng(seed)
        xf = torch.tensor(x.reshape(len(x), -1), dtype=torch.float32)
        for _ in range(method_impl(cfg)(cfg.delta_steps)):
            i, j = _pairs(y, 128, rng)
            loss = ((self.reconstruct(xf[i], xf[j]) - xf[i]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def apply(self, shots: np.ndarray, base_x: np.ndarray, base_y: np.ndarray, per_shot: int,
              rng: np.random.Generator) -> np.ndarray:
        import torch

        if per_shot == 0:
            return shots[:0]
        i, j = _pairs(base_y, len(shots) * per_shot, rng)
        bf = torch.tensor(base_x.reshape(len(base_x), -1), dtype=torch.float32)
        s = torch.tensor(np.repeat(shots.reshape(len(shots), -1), per_shot, 0), dtype=torch.float32)
        with torch.no_grad():
            delta = self.enc(torch.cat([bf[i], bf[j]], 1))
            out = s + self.dec(torch.cat([delta, s], 1))
        return out.numpy().reshape((-1,) + shots.shape[1:]).astype(np.float64)


def _pairs(y: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n random same-class, distinct-sample index pairs."""
    i = rng.integers(0, len(y), n)
    same = [np.flatnonzero(y == y[k]) for k in i]
    j = np.array([rng.choice(s[s != k]) for s, k in zip(same, i, strict=True)])
    return i, j


def calibrated_embeddings(shots: np.ndarray, base_stats: tuple[np.ndarray, np.ndarray], n: int,
                          rng: np.random.Generator, k: int = 2, extra_var: float = 0.05) -> np.ndarray:
    """Distribution calibration: mean of the shots and of the k nearest base-class means, covariance
    the mean of those base covariances (+ extra_var·I); n samples from that Gaussian."""
    means, covs = base_stats
    mu = shots.mean(0)
    near = np.argsort(((means - mu) ** 2).sum(1))[:k]
    m = (means[near].sum(0) + mu) / (k + 1)
    c = covs[near].mean(0) + extra_var * np.eye(len(mu))
    return rng.multivariate_normal(m, c, size=n, method="cholesky")


def _embed(net: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return net.embed(torch.tensor(x, dtype=torch.float32)).numpy().astype(np.float64)


def _ridge_classifier(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, lam: float = 1.0) -> np.ndarray:
    """One-hot ridge regression on L2-normalised embeddings: a linear classifier in closed form, so
    hundreds of episodes cost milliseconds each."""
    def l2(z: np.ndarray) -> np.ndarray:
        return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)

    a = np.hstack([l2(xtr), np.ones((len(xtr), 1))])
    onehot = np.eye(int(ytr.max()) + 1)[ytr]
    w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ onehot)
    return np.argmax(np.hstack([l2(xte), np.ones((len(xte), 1))]) @ w, 1)


def episodes(net: Any, cnn: Any, gen: DeltaGenerator, novel: dict[str, np.ndarray], base: dict[str, np.ndarray],
             cfg: Config, shots: int, ways: int, rng: np.random.Generator) -> dict[str, list[float]]:
    emb_nov, emb_cnn = _embed(net, novel["x"]), _embed(cnn, novel["x"])
    eb = _embed(net, base["x"])
    classes = np.unique(base["y"])
    stats = (np.stack([eb[base["y"] == c].mean(0) for c in classes]),
             np.stack([np.cov(eb[base["y"] == c].T) for c in classes]))
    accs: dict[str, list[float]] = {a: [] for a in ARMS}
    for _ in range(cfg.episodes):
        way = rng.choice(np.unique(novel["y"]), ways, replace=False)
        s_idx, q_idx, s_lab, q_lab = [], [], [], []
        for w_i, c in enumerate(way):
            pick = rng.choice(np.flatnonzero(novel["y"] == c), shots + cfg.queries, replace=False)
            s_idx += list(pick[:shots])
            q_idx += list(pick[shots:])
            s_lab += [w_i] * shots
            q_lab += [w_i] * cfg.queries
        si, qi, sl, ql = np.array(s_idx), np.array(q_idx), np.array(s_lab), np.array(q_lab)
        zs, zq = emb_nov[si], emb_nov[qi]
        dz = _embed(net, gen.apply(novel["x"][si], base["x"], base["y"], cfg.generated, rng))
        dl = np.repeat(sl, cfg.generated)
        ez = np.concatenate([calibrated_embeddings(zs[sl == w], stats, cfg.generated * shots, rng)
                             for w in range(ways)])
        el = np.repeat(np.arange(ways), cfg.generated * shots)
        sets = {"bicrossnet_no_gen": (zs, sl), "bicrossnet_delta_only": (np.vstack([zs, dz]), np.r_[sl, dl]),
                "bicrossnet_embed_only": (np.vstack([zs, ez]), np.r_[sl, el]),
                "bicrossnet_dual_gen": (np.vstack([zs, dz, ez]), np.r_[sl, dl, el])}
        for arm, (xtr, ytr) in sets.items():
            accs[arm].append(float(np.mean(_ridge_classifier(xtr, ytr, zq) == ql)))
        cs, cq = emb_cnn[si], emb_cnn[qi]
        protos = np.stack([cs[sl == w].mean(0) for w in range(ways)])
        pred = np.argmin(((cq[:, None] - protos[None]) ** 2).sum(-1), 1)
        accs["prototype_cnn"].append(float(np.mean(pred == ql)))
    return accs


def _summ(v: list[float]) -> dict[str, float]:
    a = np.asarray(v)
    return {"accuracy": float(a.mean()), "ci95": float(1.96 * a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0}


Config.METHODS = {
    "bicrossnet": Method("the extractor pre-trained on base gestures and both generators trained on base pairs", train_for),
    "null": Method("the extractor and both generators are left at their random initialisation", leave_untrained),
}


@register_suite("bicrossnet", version=1, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    set_threads(1)
    rng = np.random.default_rng(seed)
    data = synthetic(config, rng)
    ctx.record_data("synthetic_imu_gestures", data["x"].tobytes())
    x, y = data["x"], data["y"]
    mu, sd = x.mean((0, 2), keepdims=True), x.std((0, 2), keepdims=True)
    x = (x - mu) / sd
    is_base = y < config.base_classes
    # per base class: 2/3 train the extractor and the delta-generator, 1/3 held out for the gates
    held = np.zeros(len(y), bool)
    for c in range(config.base_classes):
        idx = np.flatnonzero(y == c)
        held[idx[: len(idx) // 3]] = True
    tr, ho = is_base & ~held, is_base & held
    base = {"x": x[tr], "y": y[tr]}
    novel = {"x": x[~is_base], "y": y[~is_base]}
    ctx.progress(0.05, "pre-training the extractors")
    net = pretrain(make_bicrossnet, x[tr], y[tr], config, seed)
    cnn = pretrain(make_cnn, x[tr], y[tr], config, seed)
    ctx.progress(0.4, "training the delta-generator")
    gen = DeltaGenerator(x.shape[1] * x.shape[2], config, seed)
    gen.train(x[tr], y[tr], config, seed)
    import torch

    checks: list[Check] = []
    with torch.no_grad():
        acc_base = float((net(torch.tensor(x[ho], dtype=torch.float32)).argmax(1).numpy() == y[ho]).mean())
        acc_cnn = float((cnn(torch.tensor(x[ho], dtype=torch.float32)).argmax(1).numpy() == y[ho]).mean())
        i, j = _pairs(y[ho], 512, np.random.default_rng(seed + 1))
        hf = torch.tensor(x[ho].reshape(int(ho.sum()), -1), dtype=torch.float32)
        err = float(((gen.reconstruct(hf[i], hf[j]) - hf[i]) ** 2).mean())
        copy = float(((hf[j] - hf[i]) ** 2).mean())
    checks.append(check_cmp("extractor_base_accuracy_heldout", "gate", acc_base, ">=", config.min_base_accuracy,
                            f"BiCrossNet on held-out base gestures (chance {1 / config.base_classes:.3f})"))
    checks.append(check_cmp("delta_generator_reconstructs_heldout_pairs", "gate", err / copy, "<=",
                            config.max_delta_error_ratio, "MSE(D(E(a, b), b), a) / MSE(b, a) on held-out same-class "
                            "base pairs: the delta must carry what separates a from b"))
    checks.append(check_equal("generated_shapes", "gate", [2 * config.generated, x.shape[1], x.shape[2]],
                              list(gen.apply(x[~is_base][:2], base["x"], base["y"], config.generated, rng).shape)))
    params = {"bicrossnet_extractor": n_params(net), "single_stream_cnn_extractor": n_params(cnn),
              "delta_generator": sum(p.numel() for p in list(gen.enc.parameters()) + list(gen.dec.parameters()))}
    results: dict[str, Any] = {"synthetic": {}, "basic_motions": {}}
    for k_i, shots in enumerate(config.shots):
        ctx.progress(0.45 + 0.35 * k_i / len(config.shots), f"synthetic {config.ways}-way {shots}-shot episodes")
        accs = episodes(net, cnn, gen, novel, base, config, shots, config.ways, rng)
        results["synthetic"][f"{shots}shot"] = {a: _summ(v) for a, v in accs.items()}
    # real: BasicMotions (4 classes, 80 recordings) as the new gestures, extractor from synthetic bases
    bm = basic_motions(ctx, config.length)
    bm["x"] = (bm["x"] - bm["x"].mean((0, 2), keepdims=True)) / bm["x"].std((0, 2), keepdims=True)
    for k_i, shots in enumerate(config.shots):
        ctx.progress(0.8 + 0.15 * k_i / len(config.shots), f"BasicMotions 4-way {shots}-shot")
        accs = episodes(net, cnn, gen, bm, base, config, shots, 4, rng)
        results["basic_motions"][f"{shots}shot"] = {a: _summ(v) for a, v in accs.items()}
    claims: list[Claim] = []
    for shots in config.shots:
        r = results["synthetic"][f"{shots}shot"]
        claims.append(claim(f"synthetic_{shots}shot_generators_help", f"the dual generators raise {shots}-shot "
                            "accuracy over the same extractor without them", r["bicrossnet_dual_gen"]["accuracy"] -
                            r["bicrossnet_no_gen"]["accuracy"], ">", 0.0, "accuracy difference (points/100)"))
        claims.append(claim(f"synthetic_{shots}shot_beats_prototype", f"BiCrossNet + generators beat the prototype "
                            f"baseline ({shots}-shot)", r["bicrossnet_dual_gen"]["accuracy"] -
                            r["prototype_cnn"]["accuracy"], ">", 0.0, "accuracy difference"))
        b = results["basic_motions"][f"{shots}shot"]
        claims.append(claim(f"basic_motions_{shots}shot_generators_help", "the generators help on real IMU gestures "
                            f"({shots}-shot, extractor pre-trained on synthetic gestures)",
                            b["bicrossnet_dual_gen"]["accuracy"] - b["bicrossnet_no_gen"]["accuracy"], ">", 0.0,
                            "accuracy difference; 80 recordings, 4 classes"))
    # the parameter saving is fixed by the two architectures this suite chose, not measured: reported as a
    # sanity figure, not as the paper's 27.8 % claim
    checks.append(check_cmp("extractor_fewer_params", "sanity", 1 - params["bicrossnet_extractor"] /
                            params["single_stream_cnn_extractor"], ">", 0.0,
                            "1 − params(BiCrossNet) / params(single-stream CNN of twice the per-stream width); "
                            "set by the chosen widths"))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.0))
    for ax, key in zip(axes, ("synthetic", "basic_motions"), strict=True):
        for s_i, shots in enumerate(config.shots):
            r = results[key][f"{shots}shot"]
            for a_i, arm in enumerate(ARMS):
                ax.bar(s_i * 6 + a_i, r[arm]["accuracy"], yerr=r[arm]["ci95"], color=f"C{a_i}",
                       label=arm if s_i == 0 else None)
        ax.set_xticks([s_i * 6 + 2 for s_i in range(len(config.shots))], [f"{s}-shot" for s in config.shots])
        ax.set_title(key, fontsize=8)
    axes[0].legend(fontsize=6)
    ctx.save_figure("bicrossnet_fewshot.png", fig)
    metrics: dict[str, Any] = {"episodes": results, "params": params, "base_heldout_accuracy":
                               {"bicrossnet": acc_base, "single_stream_cnn": acc_cnn},
                               "delta_reconstruction": {"mse": err, "copy_mse": copy},
                               "headline_1shot_gain": results["synthetic"][f"{config.shots[0]}shot"]
                               ["bicrossnet_dual_gen"]["accuracy"] - results["synthetic"][f"{config.shots[0]}shot"]
                               ["bicrossnet_no_gen"]["accuracy"]}
    ctx.save_json("bicrossnet_metrics.json", metrics)
    reference = {"abstract": {"UMAHand_gain_points": [11.7, 12.7], "GRHand_gain_points": [8.85, 5.25],
                              "extractor_params_reduction": 0.278}, "verified_against_paper": False}
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims)
