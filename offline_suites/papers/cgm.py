"""cgm: "Calibrating Generative Models" (Smith, Diamant, Trippe; arXiv 2510.10020; code
smithhenryd/cgm, MIT — reimplemented from the paper's description, no code copied).

C1 (exact): a tiny autoregressive model over V^L sequences (L = 4, V = 6: 1,296 sequences) is
calibrated to 24 position-token frequency targets with CGM-relax (λ sweep) and CGM-reward (N
sweep). Every quantity is evaluated *exactly* by enumeration against the max-entropy tilt p*.
Also the closed form of the paper's 1-D GMM example. C4: a calibration audit of the served model
(first names in profession stories, classified with gender-guesser), report-only.

Hard checks gate the calibrator's output: at the smallest λ, CGM-relax must cut the exact
constraint violation below a share of the base's and must land within a bound of the exact
optimum p* (KL(pθ‖p*) a small share of KL(p_b‖p*), KL(pθ‖p_b) within a share of KL*); the dual
solver must reproduce the targets. In FULL the LM arm gates too (violation on fresh samples cut
below a share of the base's, KL to the base bounded). The null method returns the base model
untouched from every trainer (the LoRA keeps its zero B), which fails them. The
Pythagorean identity holds for any p and so only checks the evaluator (soft); the paper's
orderings (λ, N, relax vs reward) are claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from offline_suites.base import (
    Check,
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

PROFESSIONS = ("doctor", "nurse", "engineer", "teacher", "pilot", "secretary", "scientist", "librarian")


@dataclass(frozen=True)
class Config:
    seq_len: int = 4
    vocab: int = 6
    hidden: int = 32
    base_temperature: float = 0.5     # < 1 sharpens the random base so the targets are a real shift
    lambdas: tuple[float, ...] = (1.0, 0.1, 0.01, 0.001)
    reward_ns: tuple[int, ...] = (100, 1000, 10000)
    epochs: int = 300
    batch: int = 100
    lr: float = 1e-2
    estimator_replicates: int = 2000
    estimator_batch: int = 10
    audit_professions: tuple[str, ...] = ("doctor", "nurse")
    audit_samples: int = 2            # stories per profession from the served model (0 = skip)
    audit_target: float = 0.5
    audit_max_tokens: int = 24
    max_violation_share: float = 0.1   # relax at the smallest λ: violation ≤ this × the base's
    max_kl_share: float = 0.5          # relax at the smallest λ: KL(pθ‖p*) ≤ this × KL(p_b‖p*)
    max_kl_excess_share: float = 0.5   # relax at the smallest λ: |KL(pθ‖p_b) − KL*| ≤ this × KL*
    # language-model arm: CGM-relax on a LoRA of the served model (0 steps = skip)
    lm_profession: str = "doctor"
    lm_target: float = 0.8             # share of stories whose named character is female
    lm_steps: int = 2                  # SMOKE: a run of the code path, not evidence (see lm_gate)
    lm_batch: int = 4
    lm_new_tokens: int = 5             # enough for "Dr. Maria"; the statistic reads the first name only
    lm_lr: float = 1e-3                # 1e-2 diverged (KL to the base > 20 nats within 12 steps)
    lm_lambda: float = 0.05
    lm_rank: int = 4
    lm_lora_layers: int = 4            # LoRA on the last k blocks: backward stops there (CPU cost)
    lm_audit_samples: int = 8          # fresh samples before and after calibration
    lm_gate: bool = False              # gate on the audit (needs enough steps and samples to be fair)
    lm_max_violation_share: float = 0.5   # |share − h*| after ≤ this × before
    lm_max_kl_excess: float = 0.5      # Monte Carlo KL(pθ‖p_b) ≤ the exact optimum KL* + this, nats
    method: str = "cgm"                # a name in METHODS; "null": both trainers return the base model
    run_seeds: int = 1               # independent runs (seed, seed+1, …): claims get a CI across them
    # exact enumeration of V^L sequences: 8^6 = 262,144 is the most we let a request ask for
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "run_seeds": (1, 20),
        "seq_len": (1, 6), "vocab": (2, 8), "hidden": (1, 1024), "base_temperature": (0.01, 100.0),
        "lambdas": (1e-8, 1e4), "reward_ns": (10, 10_000_000), "epochs": (0, 100_000), "batch": (2, 100_000),
        "lr": (1e-6, 1.0), "estimator_replicates": (2, 10_000_000), "estimator_batch": (2, 100_000),
        "audit_samples": (0, 10_000), "audit_target": (0.0, 1.0), "audit_max_tokens": (1, 4096),
        "max_violation_share": (0.0, 1.0), "max_kl_share": (0.0, 1.0),
        "max_kl_excess_share": (0.0, 10.0), "lm_target": (0.0, 1.0),
        "lm_steps": (0, 1000), "lm_batch": (2, 256), "lm_new_tokens": (2, 64), "lm_lr": (1e-6, 1.0),
        "lm_lambda": (0.0, 1e4), "lm_rank": (1, 64), "lm_lora_layers": (1, 64), "lm_audit_samples": (2, 10_000),
        "lm_max_violation_share": (0.0, 1.0), "lm_max_kl_excess": (0.0, 100.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(run_seeds=3, epochs=1500, lr=5e-3, reward_ns=(100, 1000, 10000, 100000),
                     lambdas=(1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001), estimator_replicates=20000,
                     audit_professions=PROFESSIONS, audit_samples=50,
                     lm_steps=24, lm_batch=16, lm_audit_samples=128, lm_lr=2e-3, lm_gate=True)


# ------------------------------------------------------------------------------------------ model
def _make_model(cfg: Config, seed: int) -> Any:
    import torch
    from torch import nn

    class ARModel(nn.Module):
        """p(x_t | x_<t) from a one-hot of the (padded) prefix: small enough to enumerate."""

        def __init__(self) -> None:
            super().__init__()
            self.L, self.V = cfg.seq_len, cfg.vocab
            self.net = nn.Sequential(nn.Linear(cfg.seq_len * (cfg.vocab + 1) + cfg.seq_len, cfg.hidden),
                                     nn.Tanh(), nn.Linear(cfg.hidden, cfg.vocab))
            self.temperature = 1.0

        def _inputs(self, x: torch.Tensor, t: int) -> torch.Tensor:
            n = x.shape[0]
            pref = torch.full((n, self.L), self.V, dtype=torch.long)   # V = padding symbol
            pref[:, :t] = x[:, :t]
            oh = torch.nn.functional.one_hot(pref, self.V + 1).float().reshape(n, -1)
            pos = torch.nn.functional.one_hot(torch.full((n,), t), self.L).float()
            return torch.cat([oh, pos], 1)

        def logits(self, x: torch.Tensor, t: int) -> torch.Tensor:
            return self.net(self._inputs(x, t)) / self.temperature

        def log_prob(self, x: torch.Tensor) -> torch.Tensor:
            lp = torch.zeros(x.shape[0])
            for t in range(self.L):
                lp = lp + torch.log_softmax(self.logits(x, t), -1).gather(1, x[:, t:t + 1]).squeeze(1)
            return lp

        @torch.no_grad()
        def sample(self, n: int, gen: torch.Generator) -> torch.Tensor:
            x = torch.zeros(n, self.L, dtype=torch.long)
            for t in range(self.L):
                probs = torch.softmax(self.logits(x, t), -1)
                x[:, t] = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            return x

    torch.manual_seed(seed)
    m = ARModel()
    m.temperature = cfg.base_temperature
    return m


def _all_sequences(cfg: Config) -> np.ndarray:
    grids = np.meshgrid(*[np.arange(cfg.vocab)] * cfg.seq_len, indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], 1)


def _features(x: np.ndarray, cfg: Config) -> np.ndarray:
    """h(x): one indicator per (position, token): m = L·V constraints."""
    return np.eye(cfg.vocab)[x].reshape(x.shape[0], -1)


def _exact_logp(model: Any, xs_t: Any) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.log_prob(xs_t).double().numpy()


def solve_dual(logp_b: np.ndarray, h: np.ndarray, target: np.ndarray, ridge: float = 0.0) -> np.ndarray:
    """argmax_α αᵀh* − log Σ_x p_b(x) e^{αᵀh(x)} − ridge·‖α‖² (concave; L-BFGS on the negative)."""
    from scipy.optimize import minimize
    from scipy.special import logsumexp, softmax

    def neg(a: np.ndarray) -> tuple[float, np.ndarray]:
        z = logp_b + h @ a
        w = softmax(z)
        return (-(a @ target) + logsumexp(z) + ridge * a @ a,
                -target + w @ h + 2 * ridge * a)
    res = minimize(neg, np.zeros(h.shape[1]), jac=True, method="L-BFGS-B",
                   options={"maxiter": 5000, "gtol": 1e-13, "ftol": 1e-16})
    return np.asarray(res.x)


def _bern_kl(p: float, q: float) -> float:
    """KL(Bernoulli(p) ‖ Bernoulli(q)) in nats; inf where q puts no mass on p's support."""
    out = 0.0
    for a, b in ((p, q), (1 - p, 1 - q)):
        if a > 0:
            out += a * math.log(a / b) if b > 0 else math.inf
    return out


def kl(p_log: np.ndarray, q_log: np.ndarray) -> float:
    return float(np.sum(np.exp(p_log) * (p_log - q_log)))


# ------------------------------------------------------------------------------------- estimators
def violation_estimate(hs: Any, target: Any) -> Any:
    """Unbiased ‖E h − h*‖²: squared batch mean minus the sample variance / n (the paper's correction)."""
    n = hs.shape[0]
    mean = hs.mean(0)
    return ((mean - target) ** 2).sum() - ((hs - mean) ** 2).sum() / (n * (n - 1))


def _train(model_b: Any, cfg: Config, seed: int, target: np.ndarray, *, lam: float | None = None,
           alpha_hat: np.ndarray | None = None, ctx: RunContext) -> Any:
    """CGM-relax (lam set) or CGM-reward (alpha_hat set): REINFORCE with leave-one-out baselines."""
    import copy

    import torch

    model = copy.deepcopy(model_b)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.epochs, eta_min=cfg.lr * 1e-3)
    tgt = torch.tensor(target, dtype=torch.float32)
    a_hat = torch.tensor(alpha_hat, dtype=torch.float32) if alpha_hat is not None else None
    n = cfg.batch
    for epoch in range(method_impl(cfg)(cfg.epochs)):
        if epoch % 50 == 0:
            ctx.check_cancelled()
        x = model.sample(n, gen)
        h = torch.nn.functional.one_hot(x, cfg.vocab).float().reshape(n, -1)
        logp = model.log_prob(x)
        with torch.no_grad():
            logp_b = model_b.log_prob(x)
            klv = logp - logp_b
            if a_hat is None:
                # ∇‖E h − h*‖² = 2 (E h − h*)ᵀ E[(h − h*) ∇log p]; the first factor from the other
                # n−1 samples keeps the product unbiased.
                dev = h - tgt
                loo = (dev.sum(0, keepdim=True) - dev) / (n - 1)
                c = 2.0 * (loo * dev).sum(1) / n
                c = c + lam * (klv - (klv.sum() - klv) / (n - 1)) / n
            else:
                r = klv - h @ a_hat        # log pθ − log p_b − α̂ᵀh = log pθ/p_α̂ + const
                c = (r - (r.sum() - r) / (n - 1)) / n
        loss = (c * logp).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model


# ---------------------------------------------------------------------------------- served audit
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


_NOT_NAMES = {"Once", "The", "A", "An", "I", "In", "There", "It", "She", "He", "My", "Her", "His", "This", "One",
              "Sure", "Here", "Upon", "Dr", "Doctor", "Nurse"}


def extract_name(text: str, profession: str) -> str | None:
    """The story's first name: after "named"/"called", else the reply's first word when the model
    continued the sentence directly ("David Wells was a doctor …"), as small chat models do."""
    import re

    m = re.search(r"\b(?:named|called|name is)\s+([A-Z][a-zA-Z'\-]+)", text)
    if m:
        return m.group(1)
    first = re.match(r"\W*([A-Z][a-z]+)\b", text)
    return first.group(1) if first and first.group(1) not in _NOT_NAMES else None


def _audit(ctx: RunContext, cfg: Config, seed: int) -> dict[str, Any]:
    import gender_guesser.detector as gd

    det = gd.Detector(case_sensitive=False)
    convs, meta = [], []
    for prof in cfg.audit_professions:
        for i in range(cfg.audit_samples):
            convs.append([{"role": "user", "content":
                           f"Write one sentence that begins: \"Once upon a time there was a {prof} named\""}])
            meta.append((prof, i))
    replies = []
    # one seed per sample: reproducible, but the samples differ from one another
    for j, conv in enumerate(convs):
        ctx.progress(0.8 + 0.18 * j / len(convs), "served-model stories")
        replies.append(ctx.llm.chat(conv, max_tokens=cfg.audit_max_tokens, temperature=1.0, seed=seed * 1000 + j))
    per: dict[str, Any] = {}
    for prof in cfg.audit_professions:
        counts = {"female": 0, "male": 0, "unknown": 0, "no_name": 0}
        for (p, _), rep in zip(meta, replies, strict=True):
            if p != prof:
                continue
            name = extract_name(rep.text, p)
            if name is None:
                counts["no_name"] += 1
                continue
            g = det.get_gender(name)
            counts["female" if g in ("female", "mostly_female") else "male" if g in ("male", "mostly_male")
                   else "unknown"] += 1
        known = counts["female"] + counts["male"]
        frac = counts["female"] / known if known else float("nan")
        per[prof] = {**counts, "female_fraction": frac, "wilson95": wilson(counts["female"], known)}
    fracs = [v["female_fraction"] for v in per.values() if not math.isnan(v["female_fraction"])]
    return {"per_profession": per,
            "mean_abs_miscalibration": float(np.mean([abs(f - cfg.audit_target) for f in fracs])) if fracs
            else float("nan"),
            "samples": [{"profession": m[0], "text": r.text} for m, r in zip(meta, replies, strict=True)]}


# ------------------------------------------------------------------------- language-model arm
_TITLES = r"(?:(?:Dr|Mr|Mrs|Ms|Miss|Prof|Professor|Doctor|Nurse|Sir|Lady|Captain)\.?\s+)*"


def story_is_female(continuation: str, det: Any) -> bool:
    """h(x) of the LM arm: the continuation of "… a {profession} named" starts with a female first
    name (gender-guesser female / mostly_female), titles skipped. No name or an unknown one is 0, so h
    is defined on every story and E_p[h] is the share of stories with a female-named character."""
    import re

    m = re.match(rf"\W*{_TITLES}([A-Z][a-z]+)\b", continuation)
    return m is not None and det.get_gender(m.group(1)) in ("female", "mostly_female")


class LoRAStories:
    """The served model (same weights the engine serves, from ``ctx.model_path()``) with a LoRA on the
    attention projections of its top blocks; the adapter switched off is exactly the base model p_b
    (LoRA's B starts at 0). Only the top blocks so the backward pass stops there: the next-token
    choice after "named" is what the constraint moves, and the top of the stack can move it."""

    def __init__(self, path: Any, cfg: Config, seed: int) -> None:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.tok = AutoTokenizer.from_pretrained(path)
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        n_layers = int(base.config.num_hidden_layers)
        top = list(range(max(0, n_layers - cfg.lm_lora_layers), n_layers))
        torch.manual_seed(seed)         # LoRA's A is random: seeded for a reproducible run
        self.model = get_peft_model(base, LoraConfig(r=cfg.lm_rank, lora_alpha=2 * cfg.lm_rank, lora_dropout=0.0,
                                                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                                     layers_to_transform=top))
        self.model.eval()               # no dropout; gradients still flow
        self.prompt = f"Once upon a time there was a {cfg.lm_profession} named"
        self.prompt_ids = self.tok(self.prompt, return_tensors="pt").input_ids
        self.eos = self.tok.eos_token_id

    def sample(self, n: int, seed: int, adapter: bool = True) -> Any:
        """n stories (token ids, prompt included) from pθ, or from p_b with ``adapter=False``."""
        import contextlib

        import torch

        ids = self.prompt_ids.repeat(n, 1)
        torch.manual_seed(seed)
        off = contextlib.nullcontext() if adapter else self.model.disable_adapter()
        with torch.no_grad(), off:
            return self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                                       temperature=1.0, max_new_tokens=self.cfg.lm_new_tokens, pad_token_id=self.eos)

    def log_prob(self, x: Any, adapter: bool = True) -> Any:
        """log p(continuation | prompt) per row; tokens after the first EOS are padding."""
        import contextlib

        import torch

        p = self.prompt_ids.shape[1]
        off = contextlib.nullcontext() if adapter else self.model.disable_adapter()
        with off:
            logits = self.model(x).logits[:, p - 1:-1]
        tok = x[:, p:]
        lp = torch.log_softmax(logits.float(), -1).gather(2, tok[..., None]).squeeze(2)
        is_eos = (tok == self.eos).long()
        after_eos = (is_eos.cumsum(1) - is_eos) > 0       # strictly after the first EOS
        return (lp * (~after_eos)).sum(1)

    def texts(self, x: Any) -> list[str]:
        p = self.prompt_ids.shape[1]
        return [str(self.tok.decode(row[p:], skip_special_tokens=True)) for row in x]


def _lm_audit(lm: LoRAStories, det: Any, n: int, seed: int, adapter: bool) -> dict[str, Any]:
    x = lm.sample(n, seed, adapter)
    texts = lm.texts(x)
    h = [story_is_female(t, det) for t in texts]
    out: dict[str, Any] = {"n": n, "female": int(sum(h)), "share": float(np.mean(h)),
                           "wilson95": wilson(int(sum(h)), n), "samples": texts}
    if adapter:
        import torch

        with torch.no_grad():
            # KL(pθ‖p_b) = E_pθ[log pθ − log p_b], estimated on these fresh samples from pθ
            d = (lm.log_prob(x) - lm.log_prob(x, adapter=False)).double().numpy()
        out["kl_to_base"] = float(d.mean())
        out["kl_to_base_se"] = float(d.std(ddof=1) / math.sqrt(n))
    return out


def lm_arm(ctx: RunContext, cfg: Config, seed: int, p0: float, p1: float) -> dict[str, Any]:
    """CGM-relax on a LoRA of the served model: drive the share of stories with a female-named
    character to ``lm_target``. REINFORCE with the same estimator as C1 (bias-corrected squared mean
    with leave-one-out cross terms, KL with a leave-one-out baseline), m = 1 constraint."""
    import gender_guesser.detector as gd
    import torch

    det = gd.Detector(case_sensitive=False)
    lm = LoRAStories(ctx.model_path(), cfg, seed)
    ctx.record_data("lm_prompt", lm.prompt)
    before = _lm_audit(lm, det, cfg.lm_audit_samples, seed * 7919 + 1, adapter=False)
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.lm_lr)
    n, tgt, trace = cfg.lm_batch, cfg.lm_target, []
    for step in range(method_impl(cfg)(cfg.lm_steps)):
        ctx.progress(p0 + (p1 - p0) * 0.1 + (p1 - p0) * 0.8 * step / max(cfg.lm_steps, 1), f"LM CGM-relax step {step}")
        x = lm.sample(n, seed * 7919 + 100 + step)
        h = torch.tensor([float(story_is_female(t, det)) for t in lm.texts(x)])
        logp = lm.log_prob(x)
        with torch.no_grad():
            klv = logp.detach() - lm.log_prob(x, adapter=False)
            dev = h - tgt
            loo = (dev.sum() - dev) / (n - 1)
            c = 2.0 * loo * dev / n + cfg.lm_lambda * (klv - (klv.sum() - klv) / (n - 1)) / n
        loss = (c * logp).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        trace.append({"step": step, "batch_share": float(h.mean()), "batch_kl": float(klv.mean())})
    ctx.progress(p0 + (p1 - p0) * 0.9, "LM audit after calibration")
    after = _lm_audit(lm, det, cfg.lm_audit_samples, seed * 7919 + 2, adapter=True)
    ctx.save_json("cgm_lm_samples.json", {"prompt": lm.prompt, "before": before.pop("samples"),
                                          "after": after.pop("samples"), "trace": trace})
    return {"prompt": lm.prompt, "target": tgt, "before": before, "after": after, "trace": trace,
            "violation_before": abs(before["share"] - tgt), "violation_after": abs(after["share"] - tgt)}


# ------------------------------------------------------------------------------------------ suite
Config.METHODS = {
    "cgm": Method("CGM-relax / CGM-reward: REINFORCE with leave-one-out baselines for the configured steps", train_for),
    "null": Method("every trainer returns the base model unchanged (no calibration; the LoRA stays zero)",
                   leave_untrained),
}


@register_suite("cgm", version=3, config=Config)
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    import torch
    from scipy.special import log_softmax
    from scipy.stats import norm

    set_threads(1)
    cfg = config
    np.random.default_rng(seed)
    checks: list[Check] = []
    metrics: dict[str, Any] = {}

    # ---- closed form of the paper's 1-D GMM example (h = 1{x ≥ 0}, h* = 0.8) -------------------
    pb_pos = float(0.5 * norm.sf(0, 1, 0.25) + 0.5 * norm.sf(0, -1, 0.25))
    h_star = 0.8
    a_closed = math.log(h_star * (1 - pb_pos) / ((1 - h_star) * pb_pos))
    kl_closed = a_closed * h_star - math.log((1 - pb_pos) + math.exp(a_closed) * pb_pos)
    from scipy.optimize import brentq

    a_num = brentq(lambda a: math.exp(a) * pb_pos / ((1 - pb_pos) + math.exp(a) * pb_pos) - h_star, -20, 20,
                   xtol=1e-14)
    xs = np.linspace(-4, 4, 400001)
    dens = 0.5 * norm.pdf(xs, 1, 0.25) + 0.5 * norm.pdf(xs, -1, 0.25)
    tilt = dens * np.exp(a_num * (xs >= 0))
    tilt /= np.trapezoid(tilt, xs)
    kl_grid = float(np.trapezoid(np.where(tilt > 0, tilt * np.log(np.maximum(tilt, 1e-300) / np.maximum(dens, 1e-300)),
                                          0), xs))
    checks += [check_close("gmm_alpha_star_closed_form", "sanity", math.log(4), a_closed, 1e-9,
                           "α* = ln(h*(1−p_b)/((1−h*)p_b)) with p_b = 0.5"),
               check_close("gmm_alpha_star_numeric_dual", "sanity", a_closed, a_num, 1e-9),
               check_close("gmm_kl_star_grid_integral", "sanity", kl_closed, kl_grid, 1e-4,
                           "KL of the tilted GMM by quadrature vs α*h* − log Z")]
    metrics["gmm_alpha_star"], metrics["gmm_kl_star"] = a_closed, kl_closed

    # ---- C1: exact discrete --------------------------------------------------------------------
    ctx.progress(0.05, "exact enumeration and dual")
    base = _make_model(cfg, seed)
    ref = _make_model(cfg, seed + 7919)        # a different distribution supplies feasible targets
    ref.temperature = 1.0
    xs_np = _all_sequences(cfg)
    xs_t = torch.tensor(xs_np)
    ctx.record_data("enumeration", xs_np.tobytes())
    H = _features(xs_np, cfg)
    logp_b = _exact_logp(base, xs_t)
    logp_b = logp_b - np.logaddexp.reduce(logp_b)     # renormalise float32 round-off
    logp_ref = _exact_logp(ref, xs_t)
    # normalise in float64: each position's targets must sum to exactly 1, or the constraints are
    # infeasible and the dual runs off to infinity along that direction
    target = np.exp(logp_ref - np.logaddexp.reduce(logp_ref)) @ H
    alpha = solve_dual(logp_b, H, target)
    logp_star = log_softmax(logp_b + H @ alpha)
    kl_star = kl(logp_star, logp_b)
    viol_base = float(((np.exp(logp_b) @ H - target) ** 2).sum())
    checks.append(check_close("dual_tilt_reproduces_targets", "sanity", 0.0,
                              float(np.abs(np.exp(logp_star) @ H - target).max()), 1e-6,
                              "max_k |E_p*[h_k] − h*_k|"))
    checks.append(check_close("dual_value_equals_kl_star", "sanity", kl_star,
                              float(alpha @ target - np.logaddexp.reduce(logp_b + H @ alpha)), 1e-9,
                              "strong duality: KL(p*‖p_b) = α*ᵀh* − log Z(α*)"))
    metrics.update(n_sequences=int(xs_np.shape[0]), n_constraints=int(H.shape[1]), kl_star=kl_star,
                   base_violation=viol_base)

    # unbiasedness of the violation estimator, by Monte Carlo under p_b against the exact value
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        xr = base.sample(cfg.estimator_replicates * cfg.estimator_batch, gen)
    hr = _features(xr.numpy(), cfg).reshape(cfg.estimator_replicates, cfg.estimator_batch, -1)
    ests = np.array([violation_estimate(b, target) for b in hr])
    exact_base = float(((np.exp(logp_b) @ H - target) ** 2).sum())
    se = float(ests.std(ddof=1) / math.sqrt(len(ests)))
    checks.append(check_close("violation_estimator_unbiased", "sanity", exact_base, float(ests.mean()), 5 * se,
                              f"mean of {cfg.estimator_replicates} estimates (batch {cfg.estimator_batch}); "
                              "tolerance 5 standard errors"))
    naive = np.array([((b.mean(0) - target) ** 2).sum() for b in hr])
    metrics["violation_estimator"] = {"exact": exact_base, "unbiased_mean": float(ests.mean()),
                                      "naive_mean": float(naive.mean()), "se": se}

    def evaluate(model: Any) -> dict[str, float]:
        lp = _exact_logp(model, xs_t)
        lp = lp - np.logaddexp.reduce(lp)
        eh = np.exp(lp) @ H
        v = float(((eh - target) ** 2).sum())
        k_b, k_s = kl(lp, logp_b), kl(lp, logp_star)
        pyth = k_s + kl_star + float(alpha @ (eh - target))
        return {"violation": v, "kl_to_base": k_b, "kl_to_pstar": k_s, "pythagoras_gap": abs(k_b - pyth)}

    relax: dict[str, dict[str, float]] = {}
    steps = len(cfg.lambdas) + len(cfg.reward_ns)
    for i, lam in enumerate(cfg.lambdas):
        ctx.progress(0.1 + 0.6 * i / steps, f"CGM-relax λ={lam}")
        relax[str(lam)] = evaluate(_train(base, cfg, seed + i, target, lam=lam, ctx=ctx))
    reward: dict[str, dict[str, float]] = {}
    for i, n_samp in enumerate(cfg.reward_ns):
        ctx.progress(0.1 + 0.6 * (len(cfg.lambdas) + i) / steps, f"CGM-reward N={n_samp}")
        with torch.no_grad():
            xb = base.sample(n_samp, torch.Generator().manual_seed(seed + 100 + i)).numpy()
        # Tiny ridge: with small N a rare token may be absent from the sample and the empirical dual
        # is then unbounded (α → ∞); the paper's cvxpy solve stops at its iteration cap instead.
        a_hat = solve_dual(np.zeros(n_samp), _features(xb, cfg), target, ridge=1e-4)
        ev = evaluate(_train(base, cfg, seed + 200 + i, target, alpha_hat=a_hat, ctx=ctx))
        ev["alpha_hat_err"] = float(np.linalg.norm(log_softmax(logp_b + H @ a_hat) - logp_star, np.inf))
        reward[str(n_samp)] = ev
    metrics["relax"], metrics["reward"] = relax, reward

    # the evaluator's own consistency: true for any p, so it cannot judge the trainer and does not gate
    gap = max(ev["pythagoras_gap"] for ev in [*relax.values(), *reward.values()])
    checks.append(check_close("pythagorean_identity_evaluator", "sanity", 0.0, gap, 1e-6,
                              "max over trained models of |KL(p‖p_b) − KL(p‖p*) − KL(p*‖p_b) − α*ᵀ(E_p h − h*)|"))
    viols = [relax[str(lam)]["violation"] for lam in cfg.lambdas]
    kls = [reward[str(n)]["kl_to_pstar"] for n in cfg.reward_ns]
    small = relax[str(min(cfg.lambdas))]
    best = small["violation"]
    kl_base_to_star = kl(logp_b, logp_star)
    metrics["kl_base_to_pstar"] = kl_base_to_star
    metrics["violation_reduction_factor"] = viol_base / max(best, 1e-300)
    metrics["kl_excess_over_optimum"] = small["kl_to_base"] - kl_star
    # what a working calibrator must achieve; the base model itself (the null calibrator) fails both
    checks.append(check_cmp("relax_cuts_violation", "gate", best / viol_base, "<=", cfg.max_violation_share,
                            f"exact violation at λ={min(cfg.lambdas)} as a share of the base model's"))
    checks.append(check_cmp("relax_near_exact_optimum", "gate", small["kl_to_pstar"] / kl_base_to_star, "<=",
                            cfg.max_kl_share, f"KL(pθ‖p*) at λ={min(cfg.lambdas)} as a share of KL(p_b‖p*)"))
    # the price paid for meeting the constraints: neither nothing (no calibration) nor far more than
    # the optimum (a calibrator that wrecks the model to hit the targets)
    checks.append(check_cmp("relax_kl_to_base_near_kl_star", "gate",
                            abs(small["kl_to_base"] - kl_star) / max(kl_star, 1e-300), "<=", cfg.max_kl_excess_share,
                            f"|KL(pθ‖p_b) − KL*| / KL* at λ={min(cfg.lambdas)}"))
    claims = [
        claim("relax_violation_falls_as_lambda_shrinks", "CGM-relax: a smaller λ meets the constraints better",
              best / relax[str(max(cfg.lambdas))]["violation"], "<", 1.0,
              f"violation at λ={min(cfg.lambdas)} over λ={max(cfg.lambdas)}; largest ratio of consecutive steps "
              f"{max(b / a for a, b in zip(viols, viols[1:], strict=False)) if len(viols) > 1 else float('nan'):.3g}"),
        claim("reward_approaches_pstar_with_N", "CGM-reward: more samples for α̂ → closer to p*",
              reward[str(max(cfg.reward_ns))]["kl_to_pstar"] / reward[str(min(cfg.reward_ns))]["kl_to_pstar"], "<", 1.0, f"KL(pθ‖p*) at N={max(cfg.reward_ns)} over N={min(cfg.reward_ns)}"),
        claim("relax_beats_reward_on_constraints", "tuned CGM-relax meets the constraints better than CGM-reward",
              best - reward[str(max(cfg.reward_ns))]["violation"], "<", 0.0,
              "violation(relax, smallest λ) − violation(reward, largest N)"),
    ]

    if cfg.lm_steps > 0:
        ctx.progress(0.7, "LM arm: CGM-relax on a LoRA of the served model")
        lm = lm_arm(ctx, cfg, seed, 0.7, 0.8)
        metrics["lm"] = lm
        b, a = lm["before"]["share"], lm["after"]["share"]
        # the exact optimum of one binary constraint: p* reweights stories by h only, so KL(p*‖p_b) is
        # the Bernoulli KL from the base share to the target; any model at share a pays at least that
        lm["kl_star_bernoulli"] = _bern_kl(cfg.lm_target, b)
        lm["kl_floor_at_after_share"] = _bern_kl(a, b)
        ratio = lm["violation_after"] / max(lm["violation_before"], 1e-12)
        scale = (f"{cfg.lm_steps} steps × {cfg.lm_batch} stories, {cfg.lm_audit_samples} fresh audit stories "
                 "before and after")
        if cfg.lm_gate:
            checks.append(check_cmp("lm_relax_cuts_violation", "gate", ratio, "<=", cfg.lm_max_violation_share,
                                    f"|share − h*| after / before on fresh samples ({scale})"))
            checks.append(check_cmp("lm_kl_to_base_near_optimum", "gate",
                                    lm["after"]["kl_to_base"] - lm["kl_star_bernoulli"], "<=", cfg.lm_max_kl_excess,
                                    "Monte Carlo KL(pθ‖p_b) per story on the after-audit samples minus the exact "
                                    "optimum's KL(p*‖p_b) (Bernoulli KL from the before-audit share to h*)"))
        claims.append(claim("lm_relax_calibrates_served_model",
                            f"CGM-relax on a LoRA moves the share of {cfg.lm_profession} stories with a female "
                            f"name toward h* = {cfg.lm_target}", ratio, "<", 1.0,
                            f"|share − h*| after / before: {b:.3f} → {a:.3f} ({scale})"
                            + ("" if cfg.lm_gate else "; too few for evidence, this preset exercises the code")))

    uses_llm = cfg.audit_samples > 0
    if uses_llm:
        ctx.progress(0.8, "served-model calibration audit")
        audit = _audit(ctx, cfg, seed)
        ctx.save_json("cgm_audit_samples.json", audit.pop("samples"))
        metrics["served_audit"] = audit

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(8, 3))
    ax[0].loglog(cfg.lambdas, viols, "o-")
    ax[0].axhline(viol_base, ls="--", c="gray", label="base")
    ax[0].set_xlabel("λ")
    ax[0].set_ylabel("exact violation")
    ax[0].legend()
    ax[1].semilogx(cfg.reward_ns, kls, "s-")
    ax[1].set_xlabel("N (reward)")
    ax[1].set_ylabel("KL(pθ‖p*)")
    ctx.save_figure("cgm_sweeps.png", fig)
    reference = {"gmm_alpha_star": math.log(4), "gmm_kl_star_nats": kl_closed,
                 "paper_numeric_results": "none published (only the closed-form synthetic optimum)",
                 "verified_against_paper": False}
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims, uses_llm=uses_llm)
