"""Stage 3 of the build: sparse autoencoders on the monitored network's residual stream, from the cache.

The residuals come from the build's residual cache (:mod:`guard.recipe.cache`): one forward per token,
read here for as many epochs as ``token_passes`` asks. Training rows are the select and calibration
splits' tokens that pass the serve-time causal norm filter (position 0 and attention-sink outliers are
dropped); response samples give their scored span only, so a conversation shared by a prompt sample and
its answers is not counted many times. A twentieth of those samples (by key hash) is held out for early
stopping; the test split gives the held-out numbers reported.

Training is sae-lens' BatchTopK SAE (its forward pass and AuxK loss) in our own loop, because the run
needs what its trainer does not give at this scale:
* inputs scaled so E||x||^2 = d_model (the scale is folded into the saved weights);
* the decoder bias started at the mean of the scaled inputs, not at zero, since residual tokens sit far
  from the origin;
* a latent counts as dead after ``dead_tokens`` silent training tokens (a few dozen steps), so AuxK acts
  within the run;
* linear warm-up, then a linear decay to zero over the last ``decay_frac`` of steps;
* held-out fraction of variance unexplained every ``eval_every`` steps, best state kept, early stop.

Saved SAEs are JumpReLU SAEs with one threshold: the converged BatchTopK statistic, so every latent is
independent of the others and the serve-time encoder computes only the selected columns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class SAEConfig:
    seed: int = 0
    layers: tuple[int, ...] = (10, 14)
    width: int = 4608                 # 8 x d_model of SmolLM2-135M
    k: float = 40.0
    token_passes: int = 3_000_000     # tokens seen per SAE (epochs over the cached training tokens)
    batch: int = 2048
    lr: float = 4e-4
    warmup_steps: int = 50
    decay_frac: float = 0.3           # the last 30 % of steps decay the rate linearly to zero
    dead_tokens: int = 200_000        # a latent silent for this many training tokens is dead (AuxK acts on it)
    aux_coef: float = 0.25
    eval_every: int = 100             # steps between held-out measurements
    patience: int = 4                 # held-out measurements without improvement before stopping
    heldout_tokens: int = 40_000      # early-stopping rows (held-out samples, never trained on)
    threads: int = 2
    autocast: bool | None = None      # bf16 matmuls; None = where bf16 is native (the build's dtype is bf16)


# How an SAE is trained, not what it learns: left out of the key that decides whether a committed SAE still
# matches the build's inputs, so a build resumed on a machine without native bf16 reuses it.
EXECUTION_FIELDS = ("autocast", "threads")


def sae_key_fields(cfg: SAEConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_FIELDS}


class _Stop(Exception):
    pass


def residuals_at(model: Any, id_lists: Sequence[Sequence[int]], layers: Sequence[int]) -> list[dict[int, Any]]:
    """Residual stream after each decoder layer in ``layers`` for each sequence, one batched forward that
    stops after the deepest layer. Returns per sequence ``{layer: (T, d_model) tensor}`` (model dtype)."""
    import torch

    from guard.runner import decoder_layers

    blocks = decoder_layers(model)
    top = max(layers)
    T = max(len(x) for x in id_lists)
    ids = torch.zeros((len(id_lists), T), dtype=torch.long)
    att = torch.zeros((len(id_lists), T), dtype=torch.long)
    for i, x in enumerate(id_lists):
        ids[i, : len(x)] = torch.tensor(list(x))
        att[i, : len(x)] = 1
    got: dict[int, Any] = {}

    def hook(layer: int) -> Any:
        def fn(_m: Any, _inp: Any, out: Any) -> None:
            got[layer] = (out[0] if isinstance(out, tuple) else out).detach()
            if layer == top:
                raise _Stop
        return fn

    handles = [blocks[layer].register_forward_hook(hook(layer)) for layer in layers]
    try:
        with torch.inference_mode():
            inner = getattr(model, "model", model)
            inner(input_ids=ids, attention_mask=att)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return [{layer: got[layer][i, : len(x)] for layer in layers} for i, x in enumerate(id_lists)]


def outlier_mask(resid: Any, ratio: float = 10.0) -> Any:
    """True for tokens kept for SAE training: not position 0, norm at most ``ratio`` x the median."""
    n = resid.float().norm(dim=-1)
    m = n <= ratio * n.median()
    m[0] = False
    return m


def hook_name(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


def batchtopk_threshold(sae: Any, acts: Any, k: float, batch: int = 2048) -> float:
    """The JumpReLU threshold a BatchTopK SAE implies: per batch, the smallest of the k x batch largest
    (ReLU'd) pre-activations, averaged over batches (sae-lens' own running estimate converges slowly)."""
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




def training_rows(cache: Any, layer: int, idx: Sequence[int], responses: Sequence[bool],
                  ratio: float = 10.0) -> np.ndarray:
    """Global cache rows of the samples ``idx`` that an SAE on ``layer`` trains on: tokens kept by the
    serve-time causal norm filter; for a response sample only its scored span."""
    from guard.monitor import causal_norm_mask

    norms = cache_norms(cache, layer)
    out = []
    for i, is_resp in zip(idx, responses, strict=True):
        a0, n = int(cache.starts[i]), int(cache.lengths[i])
        keep = causal_norm_mask(norms[a0:a0 + n], ratio)
        lo, hi = cache.span(i) if is_resp else (0, n)
        rows = np.nonzero(keep[lo:hi])[0] + lo + a0
        out.append(rows)
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def cache_norms(cache: Any, layer: int, chunk: int = 262_144) -> np.ndarray:
    """Per-token residual norms at ``layer`` (kept beside the cache after the first call)."""
    from guard.recipe.cache import bits_to_float

    path = cache.root / f"norms{layer}.npy"
    if path.is_file():
        return np.asarray(np.load(path))
    arr = cache.array(layer)
    out = np.empty(cache.n_tokens, dtype=np.float32)
    for a in range(0, cache.n_tokens, chunk):
        out[a:a + chunk] = bits_to_float(np.asarray(arr[a:a + chunk])).norm(dim=-1).numpy()
    np.save(path, out)
    return out


class _Rows:
    """Random batches of cached rows of one layer, held in memory as bf16 bits."""

    def __init__(self, cache: Any, layer: int, rows: np.ndarray) -> None:
        self.bits = np.asarray(cache.array(layer)[np.sort(rows)])

    def __len__(self) -> int:
        return int(self.bits.shape[0])

    def get(self, idx: np.ndarray) -> Any:
        from guard.recipe.cache import bits_to_float

        return bits_to_float(self.bits[idx])


def train_sae(cache: Any, layer: int, train_rows: np.ndarray, stop_rows: np.ndarray, cfg: SAEConfig,
              progress: Any = None) -> tuple[Any, dict[str, Any]]:
    """One BatchTopK SAE on ``layer`` from cached rows; returns the inference (JumpReLU) SAE in the raw
    residual's units and its training record."""
    import os
    import tempfile

    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch
    from sae_lens import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput

    from guard.sae import load_sae

    torch.manual_seed(cfg.seed + layer)
    g = np.random.default_rng(cfg.seed + layer)
    data = _Rows(cache, layer, train_rows)
    held = _Rows(cache, layer, stop_rows[: cfg.heldout_tokens])
    probe = data.get(g.choice(len(data), min(len(data), 32_768), replace=False))
    scale = float(np.sqrt(probe.shape[1] / float((probe ** 2).sum(-1).mean())))
    sae = BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in=int(probe.shape[1]), d_sae=cfg.width, k=cfg.k,
                                                          aux_loss_coefficient=cfg.aux_coef))
    with torch.no_grad():
        sae.b_dec.copy_((probe * scale).mean(0))
    opt = torch.optim.Adam(sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    steps = max(1, cfg.token_passes // cfg.batch)
    decay_from = int(steps * (1 - cfg.decay_frac))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        if step >= decay_from:
            return cfg.lr * max(0.0, (steps - step) / max(steps - decay_from, 1))
        return cfg.lr

    held_x = held.get(np.arange(len(held))) * scale
    held_sst = float(((held_x - held_x.mean(0)) ** 2).sum())

    def heldout_fvu() -> float:
        with torch.no_grad():
            sse = 0.0
            for a in range(0, held_x.shape[0], 4096):
                x = held_x[a:a + 4096]
                sse += float(((sae(x) - x) ** 2).sum())
        return sse / max(held_sst, 1e-12)

    silent = torch.zeros(cfg.width, dtype=torch.long)       # training tokens since each latent last fired
    dead_steps = max(1, cfg.dead_tokens // cfg.batch)
    best = (float("inf"), -1)
    best_state: dict[str, Any] | None = None
    history: list[dict[str, float]] = []
    bad = 0
    perm = g.permutation(len(data))
    pos = 0
    t0 = time.time()
    step = 0
    stopped_early = False
    for step in range(steps):
        if pos + cfg.batch > len(perm):
            perm, pos = g.permutation(len(data)), 0
        x = data.get(perm[pos:pos + cfg.batch]) * scale
        pos += cfg.batch
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        dead = silent >= dead_steps * cfg.batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.autocast)):
            out = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=dead,
                                                           n_training_steps=step, is_logging_step=False))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        with torch.no_grad():
            fired = (out.feature_acts > 0).any(0)
            silent = torch.where(fired, torch.zeros_like(silent), silent + cfg.batch)
        if (step + 1) % cfg.eval_every == 0 or step == steps - 1:
            fvu = heldout_fvu()
            point = {"step": step + 1, "heldout_fvu": fvu, "mse": float(out.losses["mse_loss"]),
                   "aux": float(out.losses.get("auxiliary_reconstruction_loss", torch.tensor(0.0))),
                   "dead_fraction": float(dead.float().mean()), "lr": lr_at(step)}
            history.append(point)
            el = time.time() - t0
            log.info("SAE layer %d step %d/%d: held-out FVU %.4f, dead %.3f, %.0f tok/s, ETA %.0f s", layer, step + 1,
                     steps, fvu, point["dead_fraction"], (step + 1) * cfg.batch / el, el / (step + 1) * (steps - step - 1))
            if progress is not None:
                progress(step + 1, steps)
            if fvu < best[0] - 1e-4:
                best, bad = (fvu, step + 1), 0
                best_state = {k: v.detach().clone() for k, v in sae.state_dict().items()}
            else:
                bad += 1
                if bad >= cfg.patience and step >= decay_from:
                    stopped_early = True
                    break
    secs = time.time() - t0
    if best_state is not None:
        sae.load_state_dict(best_state)
    sae.fold_activation_norm_scaling_factor(scale)
    with tempfile.TemporaryDirectory() as d:
        sae.save_inference_model(d)
        inf = load_sae(d)
    # the JumpReLU threshold is a statistic of the BatchTopK selection on data: a sample of training rows
    raw = data.get(np.sort(g.choice(len(data), min(len(data), 16 * cfg.batch), replace=False)))
    with torch.no_grad():
        inf.threshold.fill_(batchtopk_threshold(inf, raw, cfg.k, min(cfg.batch, raw.shape[0])))
    rec: dict[str, Any] = {"layer": layer, "train_rows": int(len(data)), "token_passes": int((step + 1) * cfg.batch),
           "epochs": (step + 1) * cfg.batch / max(len(data), 1), "steps": step + 1, "planned_steps": steps,
           "stopped_early": stopped_early, "best_step": best[1], "best_heldout_fvu": best[0], "input_scale": scale,
           "seconds": secs, "tokens_per_s": (step + 1) * cfg.batch / max(secs, 1e-9), "history": history,
           "threshold": float(inf.threshold.detach()[0])}
    return inf, rec
