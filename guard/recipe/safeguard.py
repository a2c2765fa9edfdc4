"""Stage 2 of the build: the safeguard — a LoRA fine-tune of the base model that answers " safe" / " unsafe"
after ``"<guard text>\\nVerdict:"``, from sample-level labels only.

Adapters sit on the attention and the MLP projections of every layer. Training stops when the loss on a
held-out validation set (part of the calibration split) has not improved for ``patience`` evaluations, and
the best adapter is kept. The monitor reads the safeguard *without* the verdict suffix, as the paper reads
its safeguard without the instruction template.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from guard.recipe.cache import length_batches
from guard.recipe.sources import Sample
from guard.text import prompt_text, response_text

log = logging.getLogger(__name__)

VERDICT_SUFFIX = "\nVerdict:"
VERDICT_WORDS = (" safe", " unsafe")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class SafeguardConfig:
    seed: int = 0
    r: int = 16
    lr: float = 4e-4
    batch: int = 12
    max_len: int = 256
    max_steps: int = 1200
    eval_every: int = 40
    patience: int = 2
    n_val: int = 192
    warmup: int = 20
    # bf16 matmuls under autocast: a clear win on GPUs and CPUs with AVX512-BF16/AMX, but emulated (and many
    # times slower than fp32) on plain AVX2 CPUs; None = the build decides from the hardware
    autocast: bool | None = None
    # a step's batch is sorted by length and run as micro-batches of at most this many (padded) tokens with
    # their gradients summed: the same update as one padded batch, without computing the padding of the
    # short texts up to the longest one
    micro_tokens: int = 1024


# How the adapter is trained, not what it learns from: left out of the key that decides whether a committed
# adapter still matches the build's inputs.
EXECUTION_FIELDS = ("autocast", "micro_tokens")


def training_key_fields(cfg: SafeguardConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_FIELDS}


def guard_text(s: Sample) -> str:
    return (prompt_text(s.conv) if s.response is None else response_text(s.conv, s.response)).text


def verdict_ids(tok: Any, s: Sample, max_len: int) -> list[int]:
    """Tokens of the verdict input; long texts lose their middle, the start and the end (with the suffix) stay."""
    ids = tok(guard_text(s), add_special_tokens=False)["input_ids"]
    suffix = tok(VERDICT_SUFFIX, add_special_tokens=False)["input_ids"]
    room = max_len - len(suffix)
    if len(ids) > room:
        head = room // 3
        ids = ids[:head] + ids[len(ids) - (room - head):]
    return list(ids) + list(suffix)


def _batch(tok: Any, samples: Sequence[Sample], max_len: int) -> tuple[Any, Any]:
    return _pad(tok, [verdict_ids(tok, s, max_len) for s in samples])


def _pad(tok: Any, seqs: Sequence[Sequence[int]]) -> tuple[Any, Any]:
    import torch

    T = max(len(x) for x in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, x in enumerate(seqs):       # right padding; the verdict is read at each row's last real token
        ids[i, : len(x)] = torch.tensor(x)
        att[i, : len(x)] = 1
    return ids, att


def verdict_logits(model: Any, ids: Any, att: Any, vocab_ids: Sequence[int]) -> Any:
    """Logits of the verdict words at each row's last real token; only those rows of the LM head are computed."""
    import torch

    hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state
    last = att.sum(1) - 1
    h = hidden[torch.arange(ids.shape[0]), last]
    return h.float() @ model.lm_head.weight[list(vocab_ids)].float().T


def word_ids(tok: Any) -> list[int]:
    return [tok(w, add_special_tokens=False)["input_ids"][0] for w in VERDICT_WORDS]


def _val_loss(model: Any, tok: Any, val: Sequence[Sample], cfg: SafeguardConfig, vid: Sequence[int]) -> float:
    import torch

    losses, n = 0.0, 0
    val = sorted(val, key=lambda s: len(guard_text(s)))     # similar lengths together: little padding
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.autocast)):
        for i in range(0, len(val), 32):
            chunk = val[i:i + 32]
            ids, att = _batch(tok, chunk, cfg.max_len)
            lg = verdict_logits(model, ids, att, vid)
            y = torch.tensor([s.label for s in chunk])
            losses += float(torch.nn.functional.cross_entropy(lg, y, reduction="sum"))
            n += len(chunk)
    return losses / max(n, 1)


def train_safeguard(base: Any, tok: Any, train: Sequence[Sample], val: Sequence[Sample],
                    cfg: SafeguardConfig, progress: Callable[[int, int], None] | None = None,
                    ) -> tuple[Any, dict[str, Any]]:
    """LoRA fine-tune with early stopping on ``val``; returns (peft model with the best adapter, metrics).
    ``progress(step, max_steps)`` after every step: an ETA from it is an upper bound, since validation
    usually stops the run early."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(cfg.seed)
    vid = word_ids(tok)
    pm = get_peft_model(base, LoraConfig(r=cfg.r, lora_alpha=2 * cfg.r, lora_dropout=0.05,
                                         target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM"))
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
    rng = random.Random(cfg.seed + 1)
    # balance the four (gate, label) groups so neither gate nor class dominates the verdict
    groups: dict[tuple[str, int], list[Sample]] = {}
    for s in train:
        groups.setdefault((s.gate, s.label), []).append(s)
    keys = sorted(groups)
    inner = pm.get_base_model()
    history: list[dict[str, float]] = []
    best, best_step, best_state, bad = float("inf"), 0, None, 0
    train_losses: list[float] = []
    t0 = time.time()
    step = 0
    for step in range(1, cfg.max_steps + 1):
        pm.train()
        batch = [rng.choice(groups[keys[(step * cfg.batch + i) % len(keys)]]) for i in range(cfg.batch)]
        seqs = [verdict_ids(tok, s, cfg.max_len) for s in batch]
        opt.zero_grad()
        loss_sum = 0.0
        # groups close on the token budget alone (no length slack): a step's batch is small and mixed
        for part in length_batches([len(x) for x in seqs], cfg.micro_tokens, slack=math.inf):
            ids, att = _pad(tok, [seqs[i] for i in part])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.autocast)):
                lg = verdict_logits(inner, ids, att, vid)
            # summed over the micro-batches, the gradient of the mean loss over the whole batch
            loss = torch.nn.functional.cross_entropy(lg.float(), torch.tensor([batch[i].label for i in part]),
                                                     reduction="sum") / len(batch)
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        train_losses.append(loss_sum)
        if progress is not None:
            progress(step, cfg.max_steps)
        if step % cfg.eval_every == 0:
            pm.eval()
            vl = _val_loss(inner, tok, val, cfg, vid)
            history.append({"step": step, "train_loss": float(np.mean(train_losses[-cfg.eval_every:])), "val_loss": vl,
                            "seconds": time.time() - t0})
            log.info("safeguard step %d train %.4f val %.4f (%.0fs)", step, history[-1]["train_loss"], vl, time.time() - t0)
            if vl < best - 1e-4:
                best, best_step, bad = vl, step, 0
                best_state = {k: v.detach().clone() for k, v in pm.state_dict().items() if "lora_" in k}
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
    if best_state is not None:
        pm.load_state_dict(best_state, strict=False)
    pm.eval()
    return pm, {"steps_run": step, "best_step": best_step, "best_val_loss": best, "history": history,
                "stopped_early": bad >= cfg.patience, "seconds": time.time() - t0, "targets": list(LORA_TARGETS),
                "r": cfg.r, "verdict_token_ids": vid}


def verdict_scores(model: Any, tok: Any, samples: Sequence[Sample], max_len: int, bs: int = 32) -> np.ndarray:
    """Post-hoc verdict on the whole text: logit(" unsafe") - logit(" safe")."""
    import torch

    vid = word_ids(tok)
    out = np.zeros(len(samples))
    seqs = [verdict_ids(tok, s, max_len) for s in samples]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))   # similar lengths together: little padding
    with torch.inference_mode():                 # in the model's own dtype
        for i in range(0, len(order), bs):
            part = order[i:i + bs]
            ids, att = _pad(tok, [seqs[j] for j in part])
            lg = verdict_logits(model, ids, att, vid)
            out[part] = (lg[:, 1] - lg[:, 0]).float().numpy()
    return out
