"""PBS-Attn benchmark: ``python -m inference.pbs_attn.bench [--quick]``.

Sections (all CPU here; GPU rows when CUDA is present):

0. **calibration** (``--dense-layers auto``, the default): per-layer attention-mass recall of the τ plan
   on a held-out slice of the corpus at 8K (and per length bucket above it); a layer below ``--recall-floor``
   (0.95) at the global τ gets higher τ from {0.95, …, 0.999} that reach the floor at the fewest tiles, one
   per query head by default (``--tau-granularity``), or runs dense if none does, in every later section,
   exactly as ``PBSSettings.layer_thresholds`` / ``length_thresholds`` / ``dense_layers`` make the
   integrations do.
1. **op**: attention-op latency, dense causal SDPA vs PBS (plan + sparse kernel, everything included),
   on real SmolLM2-135M Q/K/V captured from several layers at each length, plus density and
   attention-mass recall of the very plans that were timed.
2. **e2e**: SmolLM2 full prefill (``model(ids)``), transformers SDPA vs the ``pbs`` attention implementation.
3. **curves**: density vs recall for τ ∈ {0.8, 0.9, 0.95}, with and without permutation, on every layer
   of SmolLM2 at 8K and on the planted heavy-hitter generator.
4. **quality**: first-token KL(dense || PBS) and top-1 agreement on long prompts (8K).
5. **guard**: dense-vs-PBS guard verdict agreement is *not* run here (inference must not import guard);
   it is ``python -m guard.pbs_agreement``.

Inputs are real text: docstrings of the Python standard library (present on every machine that runs
this), tokenised with the SmolLM2 tokenizer. SmolLM2 was trained to 8192 positions; for longer inputs
the benchmark loads it with *linear RoPE scaling* (position interpolation, factor ``N / 8192``). The
attention patterns at 16K/32K are therefore those of a position-interpolated model, not of a model
trained at that length; this is stated in the report.

``--quick`` runs only sections 0 and 1 (at 16K and 32K). The last printed line is always one JSON list with
``{"len", "speedup_vs_sdpa", "recall", "density"}`` per op length.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import math
import pkgutil
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from inference.pbs_attn.algorithm import attention_recall_many, make_plan
from inference.pbs_attn.api import CPU_DEFAULT_BACKEND, dense_causal, get_backend
from inference.pbs_attn.config import LayerTau, PBSSettings, tau_floor
from inference.pbs_attn.synthetic import heavy_hitter_qkv

TRAINED_POSITIONS = 8192
TAUS = (0.8, 0.9, 0.95)
CALIBRATION_TAUS = (0.95, 0.98, 0.99, 0.995, 0.999)
CAPTURE_NAME = "nextguard_pbs_capture"


# --------------------------------------------------------------------------- inputs


def stdlib_corpus() -> str:
    """Deterministic English-ish prose: module, class and function docstrings of the stdlib."""
    names = sorted(
        m.name
        for m in pkgutil.iter_modules()
        if m.module_finder.path.startswith(sys.base_prefix)  # type: ignore[union-attr]
        and not m.name.startswith(("_", "test", "idlelib", "tkinter", "turtle", "antigravity", "this"))
    )
    parts: list[str] = []
    for name in names:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        doc = inspect.getdoc(mod)
        if doc:
            parts.append(doc)
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == name:
                d = inspect.getdoc(obj)
                if d and len(d) > 200:
                    parts.append(d)
    return "\n\n".join(parts)


def corpus_ids(tokenizer: Any, n: int, offset: int = 0) -> Tensor:
    ids: list[int] = tokenizer(stdlib_corpus(), add_special_tokens=False)["input_ids"]
    if len(ids) < offset + n:
        raise RuntimeError(f"corpus has {len(ids)} tokens; need {offset + n}")
    return torch.tensor(ids[offset : offset + n])[None]


def load_smollm2(max_len: int, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (fp32) with linear RoPE scaling when ``max_len`` exceeds its 8192 positions."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from inference.embedded import ensure_embedded_model

    path = ensure_embedded_model()
    config = AutoConfig.from_pretrained(path)
    if max_len > TRAINED_POSITIONS:
        factor = math.ceil(max_len / TRAINED_POSITIONS)
        config.rope_parameters = {**config.rope_parameters, "rope_type": "linear", "factor": float(factor)}
        config.max_position_embeddings = TRAINED_POSITIONS * factor
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch.float32, attn_implementation=attn_implementation
    ).eval()
    return model, AutoTokenizer.from_pretrained(path)


@contextmanager
def truncated(model: Any, n_layers: int) -> Iterator[None]:
    """Run only the first ``n_layers`` decoder layers (capturing layer L needs nothing after L)."""
    layers = model.model.layers
    model.model.layers = torch.nn.ModuleList(list(layers)[:n_layers])
    try:
        yield
    finally:
        model.model.layers = layers


def capture_qkv(model: Any, ids: Tensor, layers: list[int]) -> dict[int, tuple[Tensor, Tensor, Tensor]]:
    """Post-RoPE q (1, 9, N, 64) and k, v (1, 3, N, 64) of ``layers`` during a dense prefill."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    store: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def capture(module: Any, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
        if module.layer_idx in layers:
            store[module.layer_idx] = (query.detach().clone(), key.detach().clone(), value.detach().clone())
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(CAPTURE_NAME, capture)
    AttentionMaskInterface.register(CAPTURE_NAME, sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE_NAME)
    try:
        with torch.no_grad(), truncated(model, max(layers) + 1):
            model.model(ids, use_cache=False, logits_to_keep=1)
    finally:
        model.set_attn_implementation(previous)
    return store


# --------------------------------------------------------------------------- timing


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any]) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def op_row(
    n: int,
    qkv: dict[int, tuple[Tensor, Tensor, Tensor]],
    settings: PBSSettings,
    reps: int,
    backend: str = CPU_DEFAULT_BACKEND,
) -> dict[str, Any]:
    """Dense SDPA vs PBS (``backend``) on each captured layer; alternating order per rep, medians over reps."""
    sparse = get_backend(backend)

    def pbs(q: Tensor, k: Tensor, v: Tensor, tau: LayerTau) -> tuple[Tensor, Any, float]:
        _sync()
        t0 = time.perf_counter()
        plan = make_plan(
            q,
            k,
            threshold=tau,
            segment_size=settings.segment_size,
            block_size=settings.block_size,
        )
        _sync()
        t_plan = time.perf_counter() - t0
        return sparse(q, k, v, plan), plan, t_plan

    layers = sorted(qkv)
    sparse_layers = [i for i in layers if settings.enabled and tau_floor(settings.threshold_for(i, n)) < 1.0]
    dense_t: dict[int, list[float]] = {i: [] for i in layers}
    pbs_t: dict[int, list[float]] = {i: [] for i in layers}
    plan_t: dict[int, list[float]] = {i: [] for i in layers}
    plans = {}
    with torch.no_grad():
        q, k, v = qkv[(sparse_layers or layers)[0]]
        if sparse_layers:
            pbs(q, k, v, settings.threshold)  # compile / warm-up (the dynamic compile is shared by all lengths)
        dense_causal(q, k, v)
        for rep in range(reps):
            for i in layers:
                q, k, v = qkv[i]
                order = ("dense", "pbs") if rep % 2 == 0 else ("pbs", "dense")
                for which in order:
                    if which == "dense":
                        dense_t[i].append(_timed(functools.partial(dense_causal, q, k, v)))
                    elif i not in sparse_layers:
                        # An opted-out layer runs exactly what the integrations run for it: dense SDPA.
                        pbs_t[i].append(_timed(functools.partial(dense_causal, q, k, v)))
                        plan_t[i].append(0.0)
                    else:
                        _sync()
                        t0 = time.perf_counter()
                        _, plan, tp = pbs(q, k, v, settings.threshold_for(i, n))
                        _sync()
                        pbs_t[i].append(time.perf_counter() - t0)
                        plan_t[i].append(tp)
                        plans[i] = plan
        recalls = {
            i: attention_recall_many(qkv[i][0], qkv[i][1], [plans[i]])[0].mean().item() if i in plans else 1.0
            for i in layers
        }
    densities = {i: plans[i].density().mean().item() if i in plans else 1.0 for i in layers}
    dense_s = sum(statistics.median(dense_t[i]) for i in layers)
    pbs_s = sum(statistics.median(pbs_t[i]) for i in layers)
    plan_s = sum(statistics.median(plan_t[i]) for i in layers)
    density = statistics.mean(densities.values())
    return {
        "len": n,
        "backend": backend,
        "layers": layers,
        "dense_layers": [i for i in layers if i not in sparse_layers],
        "dense_sdpa_s": round(dense_s, 6),
        "pbs_s": round(pbs_s, 6),
        "pbs_plan_s": round(plan_s, 6),
        "speedup_vs_sdpa": round(dense_s / pbs_s, 3),
        "recall": round(statistics.mean(recalls.values()), 4),
        "min_layer_recall": round(min(recalls.values()), 4),
        "density": round(density, 4),
        "per_layer": {
            i: {
                "dense_s": round(statistics.median(dense_t[i]), 4),
                "pbs_s": round(statistics.median(pbs_t[i]), 4),
                "density": round(densities[i], 4),
                "recall": round(recalls[i], 4),
                "path": "dense (opted out)" if i not in plans else f"pbs tau={settings.threshold_for(i, n)}",
            }
            for i in layers
        },
    }


def choose_layer_threshold(
    recall_by_tau: dict[float, float], density_by_tau: dict[float, float], tau: float, floor: float
) -> float:
    """The global ``tau`` if its recall reaches ``floor``; else the smallest larger candidate that does and
    still computes fewer tiles than dense; else 1.0 (dense)."""
    for t in sorted(x for x in recall_by_tau if x >= tau):
        if recall_by_tau[t] >= floor and (t == tau or density_by_tau[t] < 1.0):
            return t
    return 1.0


def choose_head_thresholds(
    recall_by_tau: dict[float, list[float]], density_by_tau: dict[float, list[float]], tau: float, floor: float
) -> LayerTau:
    """One τ per query head so that the head-mean recall reaches ``floor`` at the fewest computed tiles.

    Greedy: every head starts at the global ``tau``; while the mean is below ``floor``, raise the one head
    whose move to a higher candidate buys the most recall per extra tile. Heads differ a lot (at 32K one
    head of SmolLM2's layer 4 keeps 0.58 of its mass at τ 0.9 where others keep 0.83), so raising τ only
    where mass is lost costs fewer tiles than one τ for the layer. Returns a scalar when every head ends
    on the same τ, and 1.0 (dense) when the candidates cannot reach the floor or compute as many tiles as
    dense attention.
    """
    taus = sorted(t for t in recall_by_tau if t >= tau)
    heads = len(recall_by_tau[tau])
    at = [0] * heads  # index into taus per head

    def mean(table: dict[float, list[float]]) -> float:
        return sum(table[taus[c]][h] for h, c in enumerate(at)) / heads

    while mean(recall_by_tau) < floor:
        best: tuple[float, int, int] | None = None
        for h in range(heads):
            here = taus[at[h]]
            for c in range(at[h] + 1, len(taus)):
                gain = recall_by_tau[taus[c]][h] - recall_by_tau[here][h]
                cost = max(density_by_tau[taus[c]][h] - density_by_tau[here][h], 1e-9)
                if gain > 0 and (best is None or gain / cost > best[0]):
                    best = (gain / cost, h, c)
        if best is None:
            return 1.0
        at[best[1]] = best[2]
    if mean(density_by_tau) >= 1.0:
        return 1.0
    chosen = tuple(taus[c] for c in at)
    return chosen[0] if len(set(chosen)) == 1 else chosen


def calibrate_section(
    settings: PBSSettings,
    n: int,
    floor: float,
    offset: int,
    candidates: tuple[float, ...] = CALIBRATION_TAUS,
    layers: list[int] | None = None,
    per_head: bool = True,
) -> dict[str, Any]:
    """Per-layer attention-mass recall on *calibration* text (a corpus slice the timed rows never see).
    A layer whose head-mean recall at the global τ falls below ``floor`` gets higher candidate τ that reach
    it at the fewest tiles: one per query head (``per_head``, :func:`choose_head_thresholds`) unless one τ
    for the layer is as cheap, else the smallest single τ (:func:`choose_layer_threshold`)
    (``layer_thresholds``), or runs dense (``dense_layers``) when none does. ``layers`` limits the
    calibration to some layers (default: all)."""
    model, tok = load_smollm2(n)
    n_layers = model.config.num_hidden_layers
    layers = list(range(n_layers)) if layers is None else sorted(layers)
    qkv = capture_qkv(model, corpus_ids(tok, n, offset=offset), layers)
    del model
    taus = sorted({settings.threshold, *(t for t in candidates if t > settings.threshold)})
    per_layer: dict[int, dict[str, Any]] = {}

    def at(table: dict[float, list[float]], tau: LayerTau) -> float:
        # head-mean of a per-head table under a scalar or per-head τ; dense (1.0) computes and keeps everything
        heads = len(table[taus[0]])
        per = [tau] * heads if isinstance(tau, float) else list(tau)
        return sum(1.0 if t >= 1.0 else table[t][h] for h, t in enumerate(per)) / heads

    with torch.no_grad():
        for i in layers:
            q, k, _ = qkv.pop(i)
            plans = [
                make_plan(
                    q,
                    k,
                    threshold=t,
                    segment_size=settings.segment_size,
                    block_size=settings.block_size,
                    gqa=settings.gqa,
                )
                for t in taus
            ]
            recs = attention_recall_many(q, k, plans)
            head_recall = {t: [round(x, 4) for x in r.mean(0).tolist()] for t, r in zip(taus, recs, strict=True)}
            head_density = {
                t: [round(x, 4) for x in p.density().mean(0).tolist()] for t, p in zip(taus, plans, strict=True)
            }
            recall = {t: round(r.mean().item(), 4) for t, r in zip(taus, recs, strict=True)}
            density = {t: round(p.density().mean().item(), 4) for t, p in zip(taus, plans, strict=True)}
            chosen: LayerTau = choose_layer_threshold(recall, density, settings.threshold, floor)
            if per_head:
                heads_tau = choose_head_thresholds(head_recall, head_density, settings.threshold, floor)
                if at(head_density, heads_tau) < at(head_density, chosen):
                    chosen = heads_tau
            per_layer[i] = {
                "recall": recall[settings.threshold],
                "min_head_recall": round(recs[0].min().item(), 4),
                "density": density[settings.threshold],
                "recall_by_tau": {str(t): v for t, v in recall.items()},
                "density_by_tau": {str(t): v for t, v in density.items()},
                "head_recall_by_tau": {str(t): v for t, v in head_recall.items()},
                "head_density_by_tau": {str(t): v for t, v in head_density.items()},
                "chosen_tau": chosen,
                "chosen_recall": round(at(head_recall, chosen), 4),
                "chosen_density": round(at(head_density, chosen), 4),
            }
    dense = [i for i, r in per_layer.items() if r["chosen_tau"] == 1.0]
    overrides = {
        i: r["chosen_tau"] for i, r in per_layer.items() if r["chosen_tau"] not in (1.0, settings.threshold)
    }
    n_cal = len(per_layer)
    out = {
        "len": n,
        "layers": layers,
        "corpus_offset": offset,
        "recall_floor": floor,
        "candidate_taus": taus,
        "per_head": per_head,
        "dense_layers": dense,
        "layer_thresholds": overrides,
        "per_layer": per_layer,
        # What the calibrated policy gives over the calibrated layers on the calibration text (dense: 1, 1).
        "all_layers_recall": round(sum(r["chosen_recall"] for r in per_layer.values()) / n_cal, 4),
        "all_layers_density": round(sum(r["chosen_density"] for r in per_layer.values()) / n_cal, 4),
        "all_layers_recall_global_tau": round(sum(r["recall"] for r in per_layer.values()) / n_cal, 4),
        "all_layers_density_global_tau": round(sum(r["density"] for r in per_layer.values()) / n_cal, 4),
    }
    summary = {k: out[k] for k in ("dense_layers", "layer_thresholds", "all_layers_recall", "all_layers_density")}
    _log(f"calibration N={n}: {json.dumps(summary)}")
    return out


def op_section(
    lengths: list[int],
    layers: list[int],
    settings: PBSSettings,
    reps: int,
    gpu_rows: list[dict[str, Any]],
    backend: str = CPU_DEFAULT_BACKEND,
) -> list[dict[str, Any]]:
    rows = []
    for n in lengths:
        model, tok = load_smollm2(n)
        t0 = time.perf_counter()
        qkv = capture_qkv(model, corpus_ids(tok, n), layers)
        capture_s = time.perf_counter() - t0
        del model
        row = op_row(n, qkv, settings, reps, backend=backend)
        row["capture_s"] = round(capture_s, 1)
        row["rope"] = "native" if n <= TRAINED_POSITIONS else f"linear x{math.ceil(n / TRAINED_POSITIONS)}"
        _log(f"op N={n}: {json.dumps({k: v for k, v in row.items() if k != 'per_layer'})}")
        rows.append(row)
        if torch.cuda.is_available():
            # Same captured activations, bf16 on the GPU, Triton kernel vs torch SDPA (FlashAttention).
            gpu = {i: tuple(x.cuda().bfloat16() for x in t) for i, t in qkv.items()}
            grow = op_row(n, gpu, settings, max(reps, 10), backend="triton")  # type: ignore[arg-type]
            grow["device"] = torch.cuda.get_device_name()
            _log(f"op GPU N={n}: {json.dumps({k: v for k, v in grow.items() if k != 'per_layer'})}")
            gpu_rows.append(grow)
    return rows


def e2e_section(lengths: list[int], settings: PBSSettings) -> list[dict[str, Any]]:
    """Full SmolLM2 prefill latency, SDPA vs PBS (gate off: every prefill at these lengths uses PBS)."""
    from inference.pbs_attn.hf import register_hf_attention, stats

    name = register_hf_attention(settings.model_copy(update={"min_len": 0}), name="pbs_bench")
    rows = []
    for n in lengths:
        model, tok = load_smollm2(n)
        ids = corpus_ids(tok, n)
        with torch.no_grad():
            model.set_attn_implementation(name)
            model(ids[:, :1024], use_cache=False, logits_to_keep=1)  # compile warm-up
            stats.reset()
            pbs_s = _timed(functools.partial(model, ids, use_cache=False, logits_to_keep=1))
            pbs_calls = stats.pbs
            model.set_attn_implementation("sdpa")
            dense_s = _timed(functools.partial(model, ids, use_cache=False, logits_to_keep=1))
        del model
        row = {
            "len": n,
            "dense_prefill_s": round(dense_s, 3),
            "pbs_prefill_s": round(pbs_s, 3),
            "speedup": round(dense_s / pbs_s, 3),
            "pbs_layer_calls": pbs_calls,
        }
        _log(f"e2e {json.dumps(row)}")
        rows.append(row)
    return rows


def _curve(q: Tensor, k: Tensor, settings: PBSSettings) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    plans, keys = [], []
    for permute in (True, False):
        for tau in TAUS:
            plans.append(
                make_plan(
                    q,
                    k,
                    threshold=tau,
                    segment_size=settings.segment_size,
                    block_size=settings.block_size,
                    permute=permute,
                )
            )
            keys.append(("perm" if permute else "no_perm", tau))
    recalls = attention_recall_many(q, k, plans)
    for (mode, tau), plan, rec in zip(keys, plans, recalls, strict=True):
        slot = out.setdefault(mode, {"tau": [], "density": [], "recall": []})
        slot["tau"].append(tau)
        slot["density"].append(plan.density().mean().item())
        slot["recall"].append(rec.mean().item())
    return out


def _mean_curves(curves: list[dict[str, dict[str, list[float]]]]) -> dict[str, dict[str, list[float]]]:
    res: dict[str, dict[str, list[float]]] = {}
    for mode in curves[0]:
        res[mode] = {
            "tau": list(TAUS),
            "density": [
                round(statistics.mean(c[mode]["density"][j] for c in curves), 4) for j in range(len(TAUS))
            ],
            "recall": [
                round(statistics.mean(c[mode]["recall"][j] for c in curves), 4) for j in range(len(TAUS))
            ],
        }
    return res


def curves_section(settings: PBSSettings, n: int = 8192) -> dict[str, Any]:
    model, tok = load_smollm2(n)
    n_layers = model.config.num_hidden_layers
    qkv = capture_qkv(model, corpus_ids(tok, n), list(range(n_layers)))
    del model
    per_layer = {i: _curve(qkv[i][0], qkv[i][1], settings) for i in range(n_layers)}
    smol = _mean_curves(list(per_layer.values()))
    _log(f"curves smollm2 N={n}: {json.dumps(smol)}")
    q, k, _ = heavy_hitter_qkv(1, 9, 3, n, 64, seed=0)
    synth = _mean_curves([_curve(q, k, settings)])
    _log(f"curves synthetic N={n}: {json.dumps(synth)}")
    return {
        "len": n,
        "smollm2_mean_over_layers": smol,
        "smollm2_per_layer": {
            i: {m: {"density": c[m]["density"], "recall": c[m]["recall"]} for m in c}
            for i, c in per_layer.items()
        },
        "synthetic_heavy_hitter": synth,
    }


def quality_section(settings: PBSSettings, n: int = 8192, prompts: int = 3) -> dict[str, Any]:
    """First generated token after a long document + question: dense vs PBS distributions."""
    from inference.pbs_attn.hf import register_hf_attention

    name = register_hf_attention(settings.model_copy(update={"min_len": 0}), name="pbs_bench")
    model, tok = load_smollm2(n)
    question = "\n\nSummarize the documentation above in one sentence."
    kls, agree = [], []
    for p in range(prompts):
        doc = tok.decode(corpus_ids(tok, n - 64, offset=p * (n + 808))[0])
        ids = tok.apply_chat_template(
            [{"role": "user", "content": doc + question}], add_generation_prompt=True, return_tensors="pt"
        )
        ids = ids["input_ids"] if not isinstance(ids, Tensor) else ids
        ids = ids[:, -n:]
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            dense = torch.log_softmax(
                model(ids, use_cache=False, logits_to_keep=1).logits[0, -1].double(), -1
            )
            model.set_attn_implementation(name)
            sparse = torch.log_softmax(
                model(ids, use_cache=False, logits_to_keep=1).logits[0, -1].double(), -1
            )
        kls.append(torch.sum(dense.exp() * (dense - sparse)).item())
        agree.append(bool(dense.argmax() == sparse.argmax()))
    row = {
        "len": n,
        "prompts": prompts,
        "kl_mean": round(statistics.mean(kls), 6),
        "kl_max": round(max(kls), 6),
        "top1_agreement": sum(agree) / len(agree),
    }
    _log(f"quality {json.dumps(row)}")
    return row


# --------------------------------------------------------------------------- report


def _log(msg: str) -> None:
    print(f"[pbs-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    for key, label in (("op", "attention op"), ("e2e", "SmolLM2 prefill")):
        rows = report.get(key) or []
        if rows:
            ax.plot(
                [r["len"] for r in rows],
                [r.get("speedup_vs_sdpa", r.get("speedup")) for r in rows],
                marker="o",
                label=label,
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("speedup vs dense SDPA (CPU)")
    ax.set_title("PBS-Attn latency")
    ax.legend()
    ax = axes[1]
    curves = report.get("curves")
    if curves:
        for src, style in (("smollm2_mean_over_layers", "-"), ("synthetic_heavy_hitter", "--")):
            for mode, color in (("perm", "C0"), ("no_perm", "C3")):
                c = curves[src][mode]
                ax.plot(
                    c["density"],
                    c["recall"],
                    style,
                    color=color,
                    marker="o",
                    label=f"{src.split('_')[0]} {mode}",
                )
        ax.set_xlabel("density (computed / causal tiles)")
        ax.set_ylabel("attention-mass recall")
        ax.set_title(f"τ ∈ {list(TAUS)} at N={curves['len']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m inference.pbs_attn.bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="only the CPU attention-op rows at 16K and 32K")
    ap.add_argument(
        "--lengths", type=int, nargs="*", help="op lengths (default 4K 8K 16K 32K; quick: 16K 32K)"
    )
    ap.add_argument("--e2e-lengths", type=int, nargs="*", default=[4096, 8192, 16384])
    ap.add_argument(
        "--layers", type=int, nargs="*", default=[4, 14, 24], help="SmolLM2 layers timed in the op rows"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--curve-len", type=int, default=8192, help="length of the density/recall and quality runs"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--backend",
        default=CPU_DEFAULT_BACKEND,
        help=f"PBS path of the CPU op rows (default: the CPU default, {CPU_DEFAULT_BACKEND!r}; e.g. gather, flex)",
    )
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--out", type=Path, default=Path("results/pbs_attn"))
    ap.add_argument(
        "--dense-layers",
        default="auto",
        help="per-layer policy: 'auto' (calibrate τ overrides / dense layers on a held-out corpus slice), "
        "'none', or a dense-layer list such as '3,4'",
    )
    ap.add_argument(
        "--layer-thresholds",
        default="",
        help="per-layer τ overrides such as '3:0.98,4:0.98', or JSON with per-head lists "
        "(use with --dense-layers none to skip calibration)",
    )
    ap.add_argument("--recall-floor", type=float, default=0.95, help="per-layer recall floor for 'auto'")
    ap.add_argument(
        "--tau-granularity",
        choices=["head", "layer"],
        default="head",
        help="calibrated τ overrides: one per query head where that needs fewer tiles (default), or one per layer",
    )
    ap.add_argument("--calibration-len", type=int, default=8192)
    ap.add_argument(
        "--length-buckets",
        default="",
        help="with 'auto': lengths that get their own τ bucket (length_thresholds), calibrated at that length on "
        "held-out text; default: every op length above --calibration-len; 'none' for one policy at every length",
    )
    ap.add_argument(
        "--bucket-layers",
        choices=["timed", "all"],
        default=None,
        help="layers calibrated per length bucket: 'timed' (the op rows' --layers; default with --quick, whose rows "
        "use no other layer) or 'all' (default otherwise; what a serving policy needs)",
    )
    ap.add_argument(
        "--length-thresholds",
        default="",
        help='per-length τ buckets as JSON, e.g. \'{"32768": {"4": 0.99}}\' (a policy an earlier run printed)',
    )
    ap.add_argument(
        "--sections",
        default="op,curves,quality,e2e",
        help="comma list of sections to run (full run only; --quick is op alone)",
    )
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    settings = PBSSettings(attention="pbs", threshold=args.threshold, min_len=0)
    lengths = args.lengths or ([16384, 32768] if args.quick else [4096, 8192, 16384, 32768])
    calibration: dict[str, Any] | None = None
    per_head = args.tau_granularity == "head"
    if args.dense_layers == "auto":
        # Calibrate on text after every slice the measured rows use, so the timed recall is held out.
        offset = max([*lengths, *args.e2e_lengths, args.curve_len])
        calibration = calibrate_section(
            settings, args.calibration_len, args.recall_floor, offset, per_head=per_head
        )
        settings = PBSSettings(
            attention="pbs",
            threshold=args.threshold,
            min_len=0,
            dense_layers=tuple(calibration["dense_layers"]),
            layer_thresholds=calibration["layer_thresholds"],
        )
    elif args.dense_layers != "none":
        settings = PBSSettings(attention="pbs", threshold=args.threshold, min_len=0, dense_layers=args.dense_layers)
    bucket_reports: list[dict[str, Any]] = []
    if args.dense_layers == "auto" and args.length_buckets != "none":
        blens = (
            [int(x) for x in args.length_buckets.split(",") if x.strip()]
            if args.length_buckets
            else [n for n in lengths if n > args.calibration_len]
        )
        blayers = args.layers if (args.bucket_layers or ("timed" if args.quick else "all")) == "timed" else None
        plain = PBSSettings(attention="pbs", threshold=args.threshold, min_len=0)
        buckets: dict[int, dict[int, LayerTau]] = {}
        for bn in sorted(set(blens)):
            # attention spreads differently at longer contexts (here also under RoPE interpolation): the 8K
            # policy need not hold at 32K, so each length gets its own τ per calibrated layer
            cal = calibrate_section(
                plain, bn, args.recall_floor, offset, layers=blayers, per_head=per_head
            )
            buckets[bn] = {int(i): r["chosen_tau"] for i, r in cal["per_layer"].items()}
            bucket_reports.append(cal)
        settings = settings.model_copy(update={"length_thresholds": buckets})
    if args.layer_thresholds:
        # a policy an earlier calibration printed (e.g. the same model and text: calibration is deterministic)
        settings = settings.model_copy(
            update={"layer_thresholds": PBSSettings(layer_thresholds=args.layer_thresholds).layer_thresholds}
        )
    if args.length_thresholds:
        settings = settings.model_copy(
            update={"length_thresholds": PBSSettings(length_thresholds=args.length_thresholds).length_thresholds}
        )
    report: dict[str, Any] = {
        "settings": settings.model_dump(),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
            "cpu_backend": args.backend,
            "cuda": torch.cuda.is_available(),
        },
        "model": "SmolLM2-135M-Instruct fp32 (9 q heads, 3 kv heads, d=64); linear RoPE scaling beyond 8192",
        "input": "Python stdlib docstrings tokenised with the SmolLM2 tokenizer",
        "quick": args.quick,
        "calibration": calibration if calibration is not None else f"not run: --dense-layers {args.dense_layers}",
        "calibration_length_buckets": bucket_reports or "not run",
    }
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "pbs_bench_quick" if args.quick else "pbs_bench"

    def save() -> None:
        # Written after every section so a long run that is cut short still leaves its measurements.
        report["wall_s"] = round(time.perf_counter() - t0, 1)
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2))

    sections = {"op"} if args.quick else {x.strip() for x in args.sections.split(",") if x.strip()}
    unknown = sections - {"op", "curves", "quality", "e2e"}
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from op, curves, quality, e2e")
    gpu_rows: list[dict[str, Any]] = []
    report["op"] = (
        op_section(lengths, args.layers, settings, args.reps, gpu_rows, backend=args.backend)
        if "op" in sections
        else []
    )
    report["op_gpu"] = gpu_rows if gpu_rows else "not run: no CUDA device in this run"
    save()
    if "curves" in sections:
        report["curves"] = curves_section(settings, args.curve_len)
        save()
    if "quality" in sections:
        report["quality"] = quality_section(settings, args.curve_len)
        save()
    if not args.quick:
        report["guard"] = {
            "done": False,
            "why": (
                "layering: inference/ must not import guard/. The guard-verdict agreement (dense vs PBS prefill, "
                "short unsafe span planted in a long benign document) is `python -m guard.pbs_agreement`, "
                "which loads the committed safeguard with this package's transformers attention"
            ),
        }
    if "e2e" in sections:
        report["e2e"] = e2e_section(args.e2e_lengths, settings)
    save()
    plot(report, args.out / f"{stem}.png")
    _log(f"wrote {args.out / (stem + '.json')} and .png")
    summary = [{k: r[k] for k in ("len", "speedup_vs_sdpa", "recall", "density")} for r in report["op"]]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
