"""Stage 3 of the build: sparse autoencoders on the monitored network's residual stream.

One streamed pass: text chunks go through the safeguard up to the deepest candidate layer, the residuals
of every candidate layer (outlier tokens dropped: position 0 and norms above 10x the chunk median, the
reference's SAE training filter) fill a shuffle buffer per layer, and sae-lens trains one BatchTopK SAE per
layer in lockstep (``MultiSAETrainer``) from that stream. Nothing is stored beyond the shuffle buffer, and
every collected token is used once. The text is about a third the served model's own transcripts in the
guard format, the rest other guard-format samples and plain English text.

Saved SAEs are JumpReLU SAEs with one threshold: the converged BatchTopK statistic, so every latent is
independent of the others and the serve-time encoder computes only the selected columns.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class SAEConfig:
    seed: int = 0
    layers: tuple[int, ...] = (10, 15)
    width: int = 4608                 # 8 x d_model of SmolLM2-135M
    k: float = 40.0
    tokens: int = 3_300_000           # distinct training tokens (one pass)
    context: int = 256
    forward_batch: int = 16           # chunks per forward
    buffer_tokens: int = 262_144      # shuffle buffer per layer
    batch: int = 2048
    lr: float = 2e-3
    warmup_steps: int = 100
    decay_frac: float = 0.2
    dead_window: int = 200
    transcript_share: float = 0.35    # the served model's conversations in the guard format
    sample_share: float = 0.15        # other guard-format samples (prompts, human-written responses)
    threads: int = 2
    autocast: bool = False            # bf16 matmuls in SAE training; only pays off where bf16 is native (GPU, AMX)


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


def text_chunks(tok: Any, transcripts: Sequence[str], samples: Sequence[str], corpus: Sequence[str],
                cfg: SAEConfig) -> list[list[int]]:
    """Token chunks for one pass of ``cfg.tokens``: transcripts and samples up to their shares, corpus for
    the rest; shuffled together so every batch mixes the kinds."""
    rng = random.Random(cfg.seed + 2)
    chunks: list[list[int]] = []
    total = 0
    budget = int(cfg.tokens * 1.06)     # the outlier filter drops a few percent
    for pool_src, share in ((transcripts, cfg.transcript_share), (samples, cfg.sample_share), (corpus, 1.0)):
        pool = list(pool_src)
        rng.shuffle(pool)
        cap = total + share * budget if share < 1.0 else budget
        for t in pool:
            if total >= cap:
                break
            ids = tok(t, add_special_tokens=False)["input_ids"]
            for i in range(0, len(ids), cfg.context):
                c = ids[i:i + cfg.context]
                if len(c) >= 16:
                    chunks.append(c)
                    total += len(c) - 1
    rng.shuffle(chunks)
    return chunks


class ResidualStream:
    """Iterator of ``{hook_name: (batch, d_model)}`` training batches, streamed from the model."""

    def __init__(self, model: Any, chunks: Sequence[Sequence[int]], cfg: SAEConfig) -> None:
        self.model, self.chunks, self.cfg = model, list(chunks), cfg
        self.pos = 0
        self.buffers: dict[int, list[Any]] = {layer: [] for layer in cfg.layers}
        self.pool: dict[int, Any] = {}
        self.g = np.random.default_rng(cfg.seed)
        self.collected = 0
        self.t_forward = 0.0

    def _fill(self) -> bool:
        import torch

        target = self.cfg.buffer_tokens
        have = sum(x.shape[0] for x in self.buffers[self.cfg.layers[0]])
        while have < target and self.pos < len(self.chunks):
            batch = self.chunks[self.pos:self.pos + self.cfg.forward_batch]
            self.pos += len(batch)
            t = time.time()
            res = residuals_at(self.model, batch, self.cfg.layers)
            self.t_forward += time.time() - t
            for r in res:
                keep = outlier_mask(r[self.cfg.layers[0]])
                for layer in self.cfg.layers:
                    self.buffers[layer].append(r[layer][keep].float())
                have += int(keep.sum())
                self.collected += int(keep.sum())
        if have == 0:
            return False
        perm = torch.from_numpy(self.g.permutation(have))
        for layer in self.cfg.layers:
            cat = torch.cat(self.buffers[layer])[perm]
            self.pool[layer] = cat
            self.buffers[layer] = []
        return True

    def __iter__(self) -> Iterator[dict[str, Any]]:
        bs = self.cfg.batch
        while True:
            if not self._fill():
                return
            n = self.pool[self.cfg.layers[0]].shape[0]
            for i in range(0, n - bs + 1, bs):
                yield {hook_name(layer): self.pool[layer][i:i + bs] for layer in self.cfg.layers}
            if self.pos >= len(self.chunks):
                return          # the stream is spent; a tail shorter than a batch is dropped
            # the tail that does not fill a batch goes back into the next buffer
            rest = n - (n // bs) * bs
            if rest:
                for layer in self.cfg.layers:
                    self.buffers[layer].append(self.pool[layer][n - rest:])


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


def train_saes(model: Any, tok: Any, transcripts: Sequence[str], samples: Sequence[str], corpus: Sequence[str],
               cfg: SAEConfig) -> tuple[dict[int, Any], dict[str, Any]]:
    """Train one SAE per candidate layer from one streamed pass; returns inference (JumpReLU) SAEs by layer."""
    import os
    import tempfile

    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch
    from sae_lens import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from sae_lens.training.multi_sae_trainer import MultiSAETrainer

    from guard.sae import load_sae

    torch.manual_seed(cfg.seed)
    chunks = text_chunks(tok, transcripts, samples, corpus, cfg)
    n_tokens = sum(len(c) - 1 for c in chunks)
    # the last 40k streamed tokens are kept aside (never trained on) to set the threshold and measure
    stream = ResidualStream(model, chunks, cfg)
    steps = int(cfg.tokens * 0.97) // cfg.batch
    total = steps * cfg.batch
    tcfg = SAETrainerConfig(
        total_training_samples=total, train_batch_size_samples=cfg.batch, lr=cfg.lr, lr_end=cfg.lr,
        lr_scheduler_name="constant", lr_warm_up_steps=cfg.warmup_steps, lr_decay_steps=int(cfg.decay_frac * steps),
        device="cpu", autocast=cfg.autocast, n_batches_for_norm_estimate=10, dead_feature_window=cfg.dead_window,
        feature_sampling_window=max(50, steps // 8))
    saes = {hook_name(layer): BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in=model.config.hidden_size,
                                                                                d_sae=cfg.width, k=cfg.k))
            for layer in cfg.layers}
    it = iter(stream)
    held: dict[str, list[Any]] = {h: [] for h in saes}

    t0 = time.time()
    trainer = MultiSAETrainer(cfg=tcfg, saes=saes, hook_names={h: h for h in saes}, data_provider=it)
    trained = trainer.fit()
    secs = time.time() - t0
    for b in it:                        # what the trainer did not consume: held-out activations
        for h in held:
            held[h].append(b[h])
    out: dict[int, Any] = {}
    metrics: dict[str, Any] = {"collected_tokens": stream.collected, "chunk_tokens": n_tokens, "train_samples": total,
                               "train_steps": steps, "seconds": secs, "forward_seconds": stream.t_forward, "per_layer": {}}
    for layer in cfg.layers:
        h = hook_name(layer)
        with tempfile.TemporaryDirectory() as d:
            trained[h].save_inference_model(d)
            inf = load_sae(d)
        hold = torch.cat(held[h]) if held[h] else None
        if hold is None or hold.shape[0] < cfg.batch:
            raise RuntimeError("the stream left too few held-out activations; raise SAEConfig.tokens or lower batch")
        half = hold.shape[0] // 2
        with torch.no_grad():
            inf.threshold.fill_(batchtopk_threshold(inf, hold[:half], cfg.k, min(cfg.batch, half)))
        from guard.sae import sae_metrics

        m = dict(sae_metrics(inf, hold[half:]))
        m["threshold"] = float(inf.threshold.detach()[0])
        metrics["per_layer"][str(layer)] = m
        out[layer] = inf
        log.info("SAE layer %d: %s", layer, m)
    return out, metrics
