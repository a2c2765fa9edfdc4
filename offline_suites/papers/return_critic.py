"""return-critic: Return-Critic, return prediction as an auxiliary task for pixel RL (ICML 2026 poster
66199; no code public — reimplemented from the abstract).

A MinAtar-style pixel environment in numpy (Catch: a 10×10 grid with a paddle channel and a ball channel,
``balls`` balls falling one after another, +1 for a catch and −1 for a miss) and a DQN with the MinAtar
reference encoder (one 3×3 conv of 16 channels). Return-Critic adds a head that samples K frames of a
completed episode from the replay buffer, encodes them with the *shared* conv encoder and regresses the
(normalised) discounted return from the first sampled frame with a one-layer Transformer read-out; the
read-out's attention over the K frames raises those transitions' replay priorities. The baseline is the same
DQN with neither. Sanity checks cover the environment (determinism, reward accounting) and the auxiliary
target (equal to the discounted return computed directly). Gates: the head itself on a key-frame diagnostic (the
return is written into one frame of K; the head must regress it and attend to that frame) and, in runs long
enough for DQN to learn Catch (``agent_gate_steps``; FULL), the agent itself: its final greedy return beats the
random policy's and its AUC is not below the baseline DQN's (same seeds, same steps) by more than a stated
margin. The sample-efficiency gain is a claim with a CI over run seeds. The null method is the baseline itself: no return head (the head
stays untrained), uniform replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from offline_suites.base import (
    Check,
    CheckKind,
    Method,
    RunContext,
    SuiteResult,
    check_close,
    check_cmp,
    check_equal,
    claim,
    method_impl,
    set_threads,
)
from offline_suites.registry import register_suite

SIDE = 10


@dataclass(frozen=True)
class Config:
    balls: int = 4                   # balls per episode (episode length balls·(SIDE−1))
    seeds: int = 2
    env_steps: int = 400             # environment steps per run
    warmup: int = 100
    buffer: int = 20_000
    batch: int = 32
    lr: float = 1e-3
    gamma: float = 0.97
    eps_decay_steps: int = 300
    target_every: int = 100
    update_every: int = 2
    eval_every: int = 100
    eval_episodes: int = 2
    rc_k: int = 8                    # frames per return-prediction sample
    rc_lambda: float = 0.5
    rc_every: int = 2                # return-head update every n DQN updates
    prio_alpha: float = 0.6
    diag_steps: int = 150            # key-frame diagnostic training steps
    diag_min_r2: float = 0.9
    diag_min_keyframe_hit: float = 0.8
    agent_gate_steps: int = 3000     # runs this long gate the agents; shorter ones (SMOKE) learn nothing yet
    min_return_over_random: float = 1.0   # the method's final greedy return must beat the random policy's by this
    max_auc_shortfall: float = 0.5   # ... and its AUC may fall at most this far below the baseline DQN's
    method: str = "return-critic"    # a name in METHODS; "null": the baseline agent itself
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "balls": (1, 50), "seeds": (1, 50), "env_steps": (100, 2_000_000), "warmup": (1, 100_000),
        "buffer": (100, 2_000_000), "batch": (1, 1024), "lr": (1e-6, 1.0), "gamma": (0.0, 1.0),
        "eps_decay_steps": (1, 2_000_000), "target_every": (1, 100_000), "update_every": (1, 100),
        "eval_every": (10, 1_000_000), "eval_episodes": (1, 1000), "rc_k": (2, 64), "rc_lambda": (0.0, 100.0),
        "rc_every": (1, 100), "prio_alpha": (0.0, 1.0), "diag_steps": (0, 100_000), "diag_min_r2": (-1.0, 1.0),
        "diag_min_keyframe_hit": (0.0, 1.0), "agent_gate_steps": (0, 2_000_000),
        "min_return_over_random": (0.0, 100.0), "max_auc_shortfall": (0.0, 100.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(run_seeds=3, seeds=4, env_steps=4000, warmup=200, eps_decay_steps=2000, eval_every=400, eval_episodes=5,
                     diag_steps=400)


@dataclass(frozen=True)
class Agent:
    """What an agent adds to DQN: the return-prediction head (trained through the shared encoder) and
    replay prioritised by the head's attention."""

    return_head: bool
    prioritised: bool


BASELINE = Agent(return_head=False, prioritised=False)


# ----------------------------------------------------------------------------------- environment
class Catch:
    """MinAtar-style Catch. Observation: (2, 10, 10) bool planes (paddle, ball). Actions: 0 left, 1 stay,
    2 right. A ball falls one row per step from a random column of row 0; on reaching row 9 the step pays
    +1 if the paddle is under it, −1 otherwise, and the next ball appears. The episode ends after ``balls`` balls."""

    def __init__(self, balls: int, seed: int) -> None:
        self.balls = balls
        self.rng = np.random.default_rng(seed)
        self.reset()

    def reset(self) -> np.ndarray:
        self.paddle = int(self.rng.integers(SIDE))
        self.ball_x, self.ball_y = int(self.rng.integers(SIDE)), 0
        self.left, self.caught, self.missed = self.balls, 0, 0
        return self.obs()

    def obs(self) -> np.ndarray:
        o = np.zeros((2, SIDE, SIDE), dtype=np.float32)
        o[0, SIDE - 1, self.paddle] = 1
        o[1, self.ball_y, self.ball_x] = 1
        return o

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        self.paddle = min(max(self.paddle + int(action) - 1, 0), SIDE - 1)
        self.ball_y += 1
        reward = 0.0
        if self.ball_y == SIDE - 1:
            hit = self.paddle == self.ball_x
            reward = 1.0 if hit else -1.0
            self.caught += hit
            self.missed += not hit
            self.left -= 1
            self.ball_x, self.ball_y = int(self.rng.integers(SIDE)), 0
        return self.obs(), reward, self.left == 0


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + γ G_{t+1}, by the backward recursion the replay buffer uses."""
    g = np.zeros(len(rewards))
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        g[t] = acc
    return g


# ------------------------------------------------------------------------------------------ models
def _modules(d: int = 32) -> dict[str, Any]:
    import torch
    from torch import nn

    enc = nn.Sequential(nn.Conv2d(2, 16, 3), nn.ReLU(), nn.Flatten())       # MinAtar reference encoder
    feat = 16 * (SIDE - 2) ** 2
    q = nn.Sequential(nn.Linear(feat, 128), nn.ReLU(), nn.Linear(128, 3))

    class ReturnHead(nn.Module):
        """K encoded frames + their normalised times → one read-out token attending over them → return."""

        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(feat + 1, d)
            self.readout = nn.Parameter(torch.zeros(1, 1, d))
            self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
            self.ff = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 1))

        def forward(self, z: Any, tpos: Any) -> tuple[Any, Any]:
            h = self.proj(torch.cat([z, tpos.unsqueeze(-1)], -1))
            out, w = self.attn(self.readout.expand(len(h), 1, -1), h, h, need_weights=True)
            return self.ff(out[:, 0]).squeeze(-1), w[:, 0]

    return {"enc": enc, "q": q, "head": ReturnHead()}


def _r2(pred: np.ndarray, y: np.ndarray) -> float:
    ss = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((pred - y) ** 2)) / ss if ss > 0 else float("nan")


def keyframe_diagnostic(cfg: Config, agent: Agent, seed: int) -> dict[str, float]:
    """Episodes of K frames of sparse random dots; exactly one frame carries a full-row marker in the ball plane
    whose row index is the return. The agent's head (through the shared encoder) must regress it (R²) and put
    its read-out attention on that frame (arg-max hit rate); chance is 1/K. An agent without a return head
    has nothing that trains it, so its head is measured at its initialisation."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    m = _modules()
    params = list(m["enc"].parameters()) + list(m["head"].parameters())
    opt = torch.optim.Adam(params, lr=3e-3)
    k = cfg.rc_k

    def batch(n: int) -> tuple[Any, Any, Any, np.ndarray]:
        x = (rng.random((n, k, 2, SIDE, SIDE)) < 0.05).astype(np.float32)
        key = rng.integers(0, k, n)
        row = rng.integers(0, SIDE, n)
        x[np.arange(n), key, 1, row, :] = 1.0
        tpos = np.tile(np.linspace(0, 1, k, dtype=np.float32), (n, 1))
        return torch.tensor(x), torch.tensor(tpos), torch.tensor(row / (SIDE - 1), dtype=torch.float32), key

    def forward(x: Any, tpos: Any) -> tuple[Any, Any]:
        z = m["enc"](x.flatten(0, 1)).view(len(x), k, -1)
        return m["head"](z, tpos)

    steps = cfg.diag_steps if agent.return_head else 0
    for _ in range(steps):
        x, tpos, y, _ = batch(32)
        pred, _ = forward(x, tpos)
        loss = ((pred - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, tpos, y, key = batch(512)
    with torch.no_grad():
        pred, w = forward(x, tpos)
    return {"r2": _r2(pred.numpy(), y.numpy()), "keyframe_hit": float(np.mean(w.numpy().argmax(1) == key)),
            "chance": 1.0 / k}


# ----------------------------------------------------------------------------------------- agent
class Replay:
    def __init__(self, cap: int) -> None:
        self.obs = np.zeros((cap, 2, SIDE, SIDE), np.float32)
        self.nxt = np.zeros_like(self.obs)
        self.act = np.zeros(cap, np.int64)
        self.rew = np.zeros(cap, np.float32)
        self.done = np.zeros(cap, np.float32)
        self.ret = np.zeros(cap, np.float32)       # discounted return-to-go, filled at episode end
        self.prio = np.ones(cap)
        self.episodes: list[tuple[int, int]] = []  # [start, end) of completed episodes
        self.n = 0
        self.cap = cap

    def add(self, o: np.ndarray, a: int, r: float, o2: np.ndarray, d: bool) -> None:
        i = self.n
        self.obs[i], self.act[i], self.rew[i], self.nxt[i], self.done[i] = o, a, r, o2, d
        self.prio[i] = self.prio[: i].max() if i else 1.0
        self.n += 1

    def end_episode(self, start: int, gamma: float) -> None:
        self.ret[start:self.n] = discounted_returns(self.rew[start:self.n].astype(np.float64), gamma)
        self.episodes.append((start, self.n))


def run_agent(cfg: Config, seed: int, agent: Agent) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    rc = agent.return_head
    m = _modules()
    target_q = _modules()
    target_q["enc"].load_state_dict(m["enc"].state_dict())
    target_q["q"].load_state_dict(m["q"].state_dict())
    params = list(m["enc"].parameters()) + list(m["q"].parameters()) + (list(m["head"].parameters()) if rc else [])
    opt = torch.optim.Adam(params, lr=cfg.lr)
    env = Catch(cfg.balls, seed)
    buf = Replay(min(cfg.buffer, cfg.env_steps + 1))
    o, start, updates = env.reset(), 0, 0
    ep_len = cfg.balls * (SIDE - 1)
    curve: list[tuple[int, float]] = []
    head_r2: list[float] = []
    for step in range(1, cfg.env_steps + 1):
        eps = max(0.05, 1.0 - step / cfg.eps_decay_steps)
        if rng.random() < eps:
            a = int(rng.integers(3))
        else:
            with torch.no_grad():
                a = int(m["q"](m["enc"](torch.tensor(o[None]))).argmax())
        o2, r, done = env.step(a)
        buf.add(o, a, r, o2, done)
        o = o2
        if done:
            buf.end_episode(start, cfg.gamma)
            o, start = env.reset(), buf.n
        if step >= cfg.warmup and step % cfg.update_every == 0:
            p = buf.prio[: buf.n] ** cfg.prio_alpha if agent.prioritised else np.ones(buf.n)
            idx = rng.choice(buf.n, cfg.batch, p=p / p.sum())
            ob, nb = torch.tensor(buf.obs[idx]), torch.tensor(buf.nxt[idx])
            with torch.no_grad():
                tgt = torch.tensor(buf.rew[idx]) + cfg.gamma * (1 - torch.tensor(buf.done[idx])) * \
                    target_q["q"](target_q["enc"](nb)).max(1).values
            qsa = m["q"](m["enc"](ob)).gather(1, torch.tensor(buf.act[idx])[:, None]).squeeze(1)
            loss = F.smooth_l1_loss(qsa, tgt)
            if rc and buf.episodes and updates % cfg.rc_every == 0:
                eps_idx = rng.integers(0, len(buf.episodes), cfg.batch)
                frames = np.stack([np.sort(rng.choice(np.arange(*buf.episodes[e]), cfg.rc_k, replace=False))
                                   for e in eps_idx])
                z = m["enc"](torch.tensor(buf.obs[frames.ravel()])).view(cfg.batch, cfg.rc_k, -1)
                tpos = torch.tensor((frames - np.array([buf.episodes[e][0] for e in eps_idx])[:, None]) / ep_len,
                                    dtype=torch.float32)
                pred, w = m["head"](z, tpos)
                y = torch.tensor(buf.ret[frames[:, 0]] / cfg.balls)
                loss = loss + cfg.rc_lambda * ((pred - y) ** 2).mean()
                head_r2.append(_r2(pred.detach().numpy(), y.numpy()))
                # attention mass over the sampled frames raises their replay priority (mean boost 1)
                np.add.at(buf.prio, frames.ravel(), (w.detach().numpy() * cfg.rc_k).ravel())
                buf.prio[: buf.n] = np.minimum(buf.prio[: buf.n], 10.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            updates += 1
            if updates % cfg.target_every == 0:
                target_q["enc"].load_state_dict(m["enc"].state_dict())
                target_q["q"].load_state_dict(m["q"].state_dict())
        if step % cfg.eval_every == 0:
            curve.append((step, _evaluate(m, cfg, seed * 1000 + step)))
    return {"curve": curve, "auc": float(np.mean([v for _, v in curve])), "final": curve[-1][1],
            "head_r2_last": float(np.nanmean(head_r2[-20:])) if head_r2 else None,
            "replay_episodes": len(buf.episodes), "buffer": buf}


def _evaluate(m: dict[str, Any], cfg: Config, seed: int) -> float:
    import torch

    env = Catch(cfg.balls, seed)
    tot = []
    for _ in range(cfg.eval_episodes):
        o, done, g = env.reset(), False, 0.0
        while not done:
            with torch.no_grad():
                a = int(m["q"](m["enc"](torch.tensor(o[None]))).argmax())
            o, r, done = env.step(a)
            g += r
        tot.append(g)
    return float(np.mean(tot))


def _bootstrap_ci(x: np.ndarray, rng: np.random.Generator, n: int = 2000) -> tuple[float, float]:
    means = rng.choice(x, (n, len(x)), replace=True).mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


# ------------------------------------------------------------------------------------------- run
def _env_checks(cfg: Config, seed: int) -> tuple[list[Check], dict[str, Any]]:
    rng = np.random.default_rng(seed)
    acts = rng.integers(0, 3, cfg.balls * (SIDE - 1) * 3)
    trajs = []
    for _ in range(2):
        env = Catch(cfg.balls, seed)
        obs, rews, counts = [env.obs()], [], []
        for a in acts:
            o, r, done = env.step(int(a))
            obs.append(o)
            rews.append(r)
            if done:
                counts.append((env.caught, env.missed))
                obs.append(env.reset())
        trajs.append((np.stack(obs), np.array(rews), counts))
    (o1, r1, c1), (o2, r2, c2) = trajs
    ep = cfg.balls * (SIDE - 1)
    per_ep = r1.reshape(-1, ep).sum(1)
    rew = r1[:ep]
    direct = np.array([sum(cfg.gamma ** k * rew[t + k] for k in range(ep - t)) for t in range(ep)])
    checks = [
        check_equal("env_deterministic", "sanity", True, bool(np.array_equal(o1, o2) and np.array_equal(r1, r2))),
        check_equal("env_reward_accounting", "sanity", [c - m for c, m in c1], per_ep.astype(int).tolist(),
                    "episode reward sum = catches − misses, counted by the environment itself"),
        check_equal("env_every_ball_scored", "sanity", [cfg.balls] * len(c1), [c + m for c, m in c1]),
        check_close("aux_target_is_discounted_return", "sanity", 0.0,
                    float(np.max(np.abs(discounted_returns(rew.astype(np.float64), cfg.gamma) - direct))), 1e-9,
                    "buffer's backward recursion vs Σ_k γ^k r_{t+k}"),
    ]
    return checks, {"random_policy_return": float(per_ep.mean())}


Config.METHODS = {
    "return-critic": Method("DQN with the Return-Critic head (shared encoder) and attention-prioritised replay",
                            Agent(return_head=True, prioritised=True)),
    "null": Method("the baseline agent: no return-prediction head (left untrained) and uniform replay", BASELINE),
}


@register_suite("return-critic", version=1, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    set_threads(1)
    cfg = config
    checks, env_info = _env_checks(cfg, seed)
    agent: Agent = method_impl(cfg)
    diag = keyframe_diagnostic(cfg, agent, seed)
    checks += [
        check_cmp("rc_head_keyframe_r2", "gate", diag["r2"], ">=", cfg.diag_min_r2,
                  "return written in one of K frames, regressed through the shared encoder"),
        check_cmp("rc_head_attends_keyframe", "gate", diag["keyframe_hit"], ">=", cfg.diag_min_keyframe_hit,
                  f"arg-max read-out attention on the key frame; chance {diag['chance']:.3f}"),
    ]
    ctx.progress(0.1, "environment and key-frame diagnostic")
    runs: dict[str, list[dict[str, Any]]] = {"dqn": [], "dqn_rc": []}
    total = 2 * cfg.seeds
    for s in range(cfg.seeds):
        for arm in runs:
            r = run_agent(cfg, seed * 100 + s, agent if arm == "dqn_rc" else BASELINE)
            buf = r.pop("buffer")
            if s == 0 and arm == "dqn_rc":
                ep0 = buf.episodes[0]
                ctx.record_data("replay_first_episode", buf.obs[ep0[0]:ep0[1]].tobytes() + buf.rew[ep0[0]:ep0[1]].tobytes())
            runs[arm].append(r)
            ctx.progress(0.1 + 0.85 * (2 * s + (arm == "dqn_rc") + 1) / total, f"seed {s} {arm}")
    auc = {k: np.array([r["auc"] for r in v]) for k, v in runs.items()}
    final = {k: np.array([r["final"] for r in v]) for k, v in runs.items()}
    diff = auc["dqn_rc"] - auc["dqn"]
    ci = _bootstrap_ci(diff, np.random.default_rng(seed))
    rand = env_info["random_policy_return"]
    # the agent itself against the same DQN trained on the same steps and seeds; too short a run teaches
    # neither agent anything (SMOKE: both stay at the random policy's return), so there they are only reported
    agent_kind: CheckKind = "gate" if cfg.env_steps >= cfg.agent_gate_steps else "sanity"
    short = "" if agent_kind == "gate" else f"; {cfg.env_steps} steps < {cfg.agent_gate_steps}: not a gate at this length"
    checks += [
        check_cmp("rc_agent_beats_random_policy", agent_kind, float(final["dqn_rc"].mean()) - rand, ">=",
                  cfg.min_return_over_random,
                  f"the method's mean final greedy return over the random policy's {rand:.2f}{short}"),
        check_cmp("rc_agent_not_below_dqn", agent_kind, float(diff.mean()), ">=", -cfg.max_auc_shortfall,
                  f"mean AUC(method) − AUC(DQN), same seeds and steps{short}"),
    ]
    r2s = [r["head_r2_last"] for r in runs["dqn_rc"] if r["head_r2_last"] is not None]
    if r2s:
        checks.append(check_cmp("rc_head_beats_constant_on_catch", "sanity", float(np.mean(r2s)), ">", 0.0,
                                "batch R² of the return head over its last 20 updates"))
    claims = [
        claim("rc_sample_efficiency", "Return-Critic raises return at equal environment steps (area under the "
              "evaluation curve)", float(diff.mean()), ">", 0.0,
              f"mean AUC(DQN+RC) − AUC(DQN) over {cfg.seeds} seeds; 95 % bootstrap CI [{ci[0]:.3f}, {ci[1]:.3f}]"),
        claim("rc_relative_gain", "the paper's +68 % average gain (here: relative AUC gain over the baseline, "
              "returns shifted by the random policy's)", float(diff.mean() / max(abs(auc["dqn"].mean() - rand), 1e-9)),
              ">=", 0.68, "the verdict is the platform's: a CI over run seeds, not the bootstrap above",
              no_effect=0.0),
    ]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for arm, rs in runs.items():
        steps = [s for s, _ in rs[0]["curve"]]
        vals = np.array([[v for _, v in r["curve"]] for r in rs])
        ax.plot(steps, vals.mean(0), "o-", label=arm)
        ax.fill_between(steps, vals.min(0), vals.max(0), alpha=0.2)
    ax.axhline(rand, color="k", ls="--", lw=0.8, label="random policy")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("greedy return")
    ax.legend(fontsize=7)
    ctx.save_figure("return_critic_curves.png", fig)
    metrics: dict[str, Any] = {"keyframe_diagnostic": diag, "env": env_info, "runs": runs,
                               "auc": {k: v.tolist() for k, v in auc.items()},
                               "final": {k: v.tolist() for k, v in final.items()},
                               "auc_diff_mean": float(diff.mean()), "auc_diff_ci95": list(ci)}
    ctx.save_json("return_critic_metrics.json", metrics)
    reference = {"paper_dmcontrol_9_tasks_average_gain": 0.68, "verified_against_paper": False}
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims)
