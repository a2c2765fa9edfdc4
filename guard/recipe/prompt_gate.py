"""Refit the prompt gate of a finished build, keeping everything else it built.

A change to how the prompt gate is fitted (its generated prompts, its read-out settings, its budget) leaves
the safeguard, the SAE, the layer choice and the response gate as they were, but a full build re-forwards every
sample, and most of the tokens are long answers that only the response gate reads: an hour on the 2-core
machine. This forwards the dataset's prompt samples alone (a few minutes per monitored network) through the
build's residual cache and encoder, fits the prompt gate exactly as the build's monitor stage does
(:func:`guard.recipe.pipeline.fit_monitor` with ``gates=("prompt",)``, the same generated prompts), and writes
each monitor back with its response gate unchanged. The build's record says the prompt gate was refitted,
with which settings and when; a later full build sees a different fitting key and refits both gates.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from guard.bundle import MonitorSpec, read_manifest
from guard.recipe import data as DATA
from guard.recipe.pipeline import (
    PRESETS,
    BuildConfig,
    Progress,
    _commit,
    _file_hash,
    _hash,
    default_work_dir,
    fit_monitor,
    generated_prompts,
    has_generated,
    monitored_id,
)
from guard.recipe.sources import data_hash

log = logging.getLogger(__name__)

# the build settings a prompt-gate refit may change; any other difference from the build's own settings would
# leave the kept parts (safeguard, SAE, layer, response gate) built with settings the record no longer names
PROMPT_GATE_FIELDS = frozenset({
    "prompt_head_grid", "prompt_head_fit", "prompt_head_c", "prompt_head_final", "prompt_refit_grid",
    "prompt_refit_c", "structured_negatives", "edgy_negatives", "direct_positives", "budget_prompt", "threads",
    "prompt_probe", "prompt_probe_hidden", "prompt_probe_linear",
})


@dataclass
class FinishedBuild:
    """A finished build opened for refitting one of its parts, its dataset checked against its record."""

    out: Path
    prov: dict[str, Any]
    manifest: dict[str, Any]
    cfg: BuildConfig
    new_cfg: dict[str, Any]          # ``cfg`` as the provenance records it
    changed: list[str]               # settings that differ from the build's
    base_model: str | Path
    dataset: Any

    @property
    def dtype(self) -> str:
        """The monitors' dtype where this CPU runs it natively, fp32 elsewhere."""
        from guard.hardware import build_dtype

        return build_dtype(str(self.manifest["dtype"]))

    def answers(self) -> tuple[list[Any], list[int], list[int]]:
        """The select then calibration answers of the dataset, and their positions: the rows (and the order) of
        the answer cache the response refits share, so that one resumes another's forward."""
        sel = [s for s in self.dataset.splits["select"] if s.gate == "response"]
        cal = [s for s in self.dataset.splits["calib"] if s.gate == "response"]
        return sel + cal, list(range(len(sel))), list(range(len(sel), len(sel) + len(cal)))

    def monitor_cache(self, name: str, model: Any, tok: Any, samples: list[Any], folder: Path,
                      progress: Callable[[float], None]) -> Any:
        """The residual cache of ``samples`` at the build's layer through monitor ``name``'s network ``model``,
        kept in ``folder`` so that an interrupted refit resumes (bf16 rows whatever the network's dtype); its
        progress takes the first 80 % of the monitor's stage."""
        from guard.recipe.cache import build_cache

        adapter = self.out / "lora" if name == "lora" else None
        return build_cache(model, tok, samples, (int(self.manifest["layer"]),), folder,
                           model_id=monitored_id(str(self.prov.get("base_model")), adapter),
                           max_tokens=self.cfg.max_tokens, dtype=self.dtype,
                           progress=lambda d, n: progress(0.8 * d / n))


def open_finished_build(out_dir: str | Path, base_model: str | Path | None, preset: str,
                        overrides: dict[str, Any] | None, allowed: frozenset[str], what: str) -> FinishedBuild:
    """The build in ``out_dir`` and the settings ``overrides`` change; a change outside ``allowed`` (the
    settings of the part being refitted) is refused, since the kept parts were built without it."""
    out = Path(out_dir)
    prov_f = out / "provenance.json"
    if not prov_f.is_file():
        raise FileNotFoundError(f"{prov_f} not found: refitting the {what} needs a finished build in {out}")
    prov = json.loads(prov_f.read_text())
    man = read_manifest(out)
    cfg: BuildConfig = replace(PRESETS[preset], **(overrides or {}))
    new_cfg = json.loads(json.dumps(asdict(cfg), default=str))
    old_cfg = prov["config"]
    # a setting added after the build has no entry in its record; at the preset's default (off for the settings
    # added so far) it is what the build did
    defaults = json.loads(json.dumps(asdict(PRESETS[preset]), default=str))
    changed = sorted(k for k in set(old_cfg) | set(new_cfg)
                     if json.dumps(old_cfg.get(k), default=str) != json.dumps(new_cfg.get(k), default=str)
                     and not (k not in old_cfg and k not in allowed and new_cfg.get(k) == defaults.get(k)))
    if bad := [k for k in changed if k not in allowed]:
        raise ValueError(f"settings the {what} refit keeps as built differ from the build's: {bad}; "
                         "run a full `nextguard guard build` for those")
    if base_model is None and prov.get("base_model") != "embedded":
        raise ValueError(f"the build monitored {prov.get('base_model')!r}: pass it as --base-model")
    if base_model is None:
        from inference.embedded import ensure_embedded_model

        base_model = ensure_embedded_model()
    ds = DATA.load_dataset(out / "data.jsonl.gz")
    for split in ("select", "calib", "test"):
        if data_hash(ds.splits[split]) != prov["data"]["splits"][split]["sha256"]:
            raise ValueError(f"{out / 'data.jsonl.gz'}'s {split} split is not the one the build was fitted on")
    return FinishedBuild(out, prov, man, cfg, new_cfg, changed, base_model, ds)


@dataclass(frozen=True)
class PartRefit:
    """One part of every monitor of a finished build, refitted alone, and where its records go: the monitor's
    report (``report[gate][part]``), the provenance list ``<name>_refits`` and the build record key
    ``<name>-refit:``."""

    gate: str
    part: str                        # "" for the whole gate
    name: str
    message: str                     # the commit message
    minutes: float = 5.0             # the progress estimate per monitor


# one monitor's refit: (monitor name, its network, tokenizer, its spec, a progress callback taking the share
# done) -> (new spec, the part's record)
PartFit = Callable[[str, Any, Any, MonitorSpec, Callable[[float], None]], tuple[MonitorSpec, dict[str, Any]]]


def refit_each_monitor(fb: FinishedBuild, refit: PartRefit, fit: PartFit, record: dict[str, Any],
                       summary: Callable[[dict[str, Any], float], dict[str, Any]],
                       commit_stages: bool = False, dataset: DATA.Dataset | None = None) -> dict[str, Any]:
    """Run ``fit`` on every monitor of ``fb`` with its network loaded (base, or base + LoRA) in the build's
    dtype, save what it returns, and record it: the monitor's build record (a new key, so that a later full
    build refits everything), the provenance (``record`` with ``summary(part record, seconds)`` per monitor)
    and, with ``commit_stages``, a commit. ``dataset``: the rows the parts were fitted on where they are not
    the build's own (``fb.dataset``); it is written as the build's dataset once every monitor is saved.
    Returns the provenance."""
    import torch

    from guard.runner import load_guard_model

    out, prov, cfg = fb.out, fb.prov, fb.cfg
    prov_f = out / "provenance.json"
    dtype = fb.dtype
    torch.set_num_threads(cfg.threads)
    names = [str(m) for m in fb.manifest["monitors"]]
    prog = Progress({f"{refit.name}_{n}": refit.minutes for n in names})
    t_all = time.time()
    record = {**record, "dtype": dtype, "monitors": {}}
    for name in names:
        stage = f"{refit.name}_{name}"
        prog.start(stage)
        t0 = time.time()
        model, tok = load_guard_model(fb.base_model, out / "lora" if name == "lora" else None, dtype=dtype)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        def progress(share: float, stage: str = stage) -> None:
            prog.update(stage, share)

        new, part = fit(name, model, tok, MonitorSpec.load(out / "monitors" / name, name), progress)
        del model
        new.save(out / "monitors" / name)
        rec_f = out / "monitors" / name / "build.json"
        rec = json.loads(rec_f.read_text()) if rec_f.is_file() else {"report": {}}
        if refit.part:
            rec["report"].setdefault(refit.gate, {})[refit.part] = part
        else:
            rec["report"][refit.gate] = part
        seconds = time.time() - t0
        rec = {"key": refit.name.replace("_", "-") + "-refit:" + _hash([rec.get("key"), fb.new_cfg]),
               "report": rec["report"], f"{refit.name}_refit": {"previous_key": rec.get("key"), "seconds": seconds}}
        rec_f.write_text(json.dumps(rec, default=str))
        if refit.part:
            prov.setdefault("monitors", {}).setdefault(name, {}).setdefault(refit.gate, {})[refit.part] = part
        else:
            prov.setdefault("monitors", {}).setdefault(name, {})[refit.gate] = part
        record["monitors"][name] = summary(part, seconds)
        prog.finish(stage)
    record.update(seconds=time.time() - t_all, machine=platform.platform(),
                  created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    prov["config"] = fb.new_cfg
    paths = [out / "monitors", prov_f]
    if dataset is not None:
        info = DATA.write_dataset(dataset, out / "data.jsonl.gz")
        prov["data"] = {"sources": dataset.sources, "splits": info}
        paths.append(out / "data.jsonl.gz")
    prov.setdefault(f"{refit.name}_refits", []).append(record)
    prov_f.write_text(json.dumps(prov, indent=1, default=str))
    _commit(paths, refit.message, commit_stages)
    return prov


def refit_prompt_gate(out_dir: str | Path, base_model: str | Path | None = None, preset: str = "cpu",
                      work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                      commit_stages: bool = False) -> dict[str, Any]:
    """Refit every monitor's prompt gate in ``out_dir`` (a finished build); returns the updated provenance."""
    import torch

    from guard.recipe.cache import build_cache
    from guard.recipe.encode import encode_cached
    from guard.runner import load_guard_model
    from guard.sae import load_sae

    fb = open_finished_build(out_dir, base_model, preset, overrides, PROMPT_GATE_FIELDS, "prompt gate")
    out, prov, man, cfg, new_cfg, changed, base_model, ds = (fb.out, fb.prov, fb.manifest, fb.cfg, fb.new_cfg,
                                                              fb.changed, fb.base_model, fb.dataset)
    prov_f = out / "provenance.json"
    dtype, layer = str(man["dtype"]), int(man["layer"])
    work = Path(work_dir) if work_dir is not None else default_work_dir(preset)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)

    sel = [s for s in ds.splits["select"] if s.gate == "prompt"]
    cal = [s for s in ds.splits["calib"] if s.gate == "prompt"]
    sae = load_sae(out / "sae")
    names = [str(m) for m in man["monitors"]]
    prog = Progress({f"prompt_{n}": 5.0 for n in names})
    t_all = time.time()
    record: dict[str, Any] = {"changed": {k: new_cfg[k] for k in changed}, "layer": layer, "dtype": dtype,
                              "prompt_samples": {"select": len(sel), "calib": len(cal)}, "monitors": {}}
    for name in names:
        stage = f"prompt_{name}"
        prog.start(stage)
        t0 = time.time()
        model, tok = load_guard_model(base_model, out / "lora" if name == "lora" else None, dtype=dtype)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        # the prompt samples' residuals go through the build's own cache and encoder (the same batching,
        # tokenisation and bf16 storage as the build); the cache is keyed by the network and the samples and
        # resumes after an interruption
        net_id = monitored_id(str(prov.get("base_model")), out / "lora" if name == "lora" else None)
        cache = build_cache(model, tok, sel + cal, (layer,), work / "cache" / f"prompt-gate-{name}", model_id=net_id,
                            max_tokens=cfg.max_tokens, dtype=dtype,
                            progress=lambda d, n, st=stage: prog.update(st, 0.6 * d / n))
        enc = {"select": encode_cached(cache, sae, layer, list(range(len(sel)))),
               "calib": encode_cached(cache, sae, layer, list(range(len(sel), len(sel) + len(cal))))}
        prefix = work / "encoded" / f"prompt-gate-{name}-{_hash([net_id, _file_hash(out / 'sae' / 'sae_weights.safetensors')])}"
        extra = generated_prompts(model, tok, sae, layer, cfg, Path(f"{prefix}-generated")) if has_generated(cfg) else None
        prog.update(stage, 0.7)
        fits, rep = fit_monitor({"prompt": enc["select"]}, {"prompt": sel}, {"prompt": enc["calib"]}, {"prompt": cal},
                                cfg, grid=True, extra=extra, gates=("prompt",))
        old = MonitorSpec.load(out / "monitors" / name, name)
        spec = MonitorSpec.from_gates({"prompt": fits["prompt"].spec, "response": old.gates["response"]}, sae, name,
                                      old.info, {"prompt": fits["reference/prompt"].spec,
                                                 "response": old.reference["response"]})
        # the response gate's residual probe keeps its encoder column; the prompt gate's probe is fitted again,
        # on the sum with the new read-out
        resp = old.gates["response"]
        if resp.probe is not None:
            cols = [old.encoder.probe_ids.index(i) for i in resp.probe.ids]
            spec = replace(spec, encoder=spec.encoder.with_probes(old.encoder.probe_W[:, cols], list(resp.probe.ids)))
        if cfg.prompt_probe:
            from guard.recipe.prompt_probe import fit_prompt_probe, model_rows, prompt_samples

            p_sel, p_cal = prompt_samples(ds.splits, cfg)
            spec, rep["prompt"]["probe"] = fit_prompt_probe(spec, model_rows(model, tok, layer, cfg.max_tokens),
                                                            p_sel, p_cal, cfg.budget_prompt, cfg.prompt_probe_hidden,
                                                            cfg.prompt_probe_linear)
        spec.save(out / "monitors" / name)
        rec_f = out / "monitors" / name / "build.json"
        rec = json.loads(rec_f.read_text()) if rec_f.is_file() else {"report": {}}
        report = {**{k: v for k, v in rec["report"].items() if not k.endswith(("_negatives", "_positives"))}, **rep}
        seconds = time.time() - t0
        rec = {"key": "prompt-refit:" + _hash([rec.get("key"), changed, new_cfg]), "report": report,
               "prompt_refit": {"previous_key": rec.get("key"), "seconds": seconds}}
        rec_f.write_text(json.dumps(rec, default=str))
        prov.setdefault("monitors", {})[name] = report
        record["monitors"][name] = {"seconds": seconds, "calib": rep["prompt"]["chosen"]}
        prog.finish(stage)
        del model
    record.update(seconds=time.time() - t_all, machine=platform.platform(),
                  created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    prov["config"] = new_cfg
    prov.setdefault("prompt_refits", []).append(record)
    prov_f.write_text(json.dumps(prov, indent=1, default=str))
    _commit([out / "monitors", prov_f], "guard build: prompt gate refitted (" + ", ".join(changed or ["same settings"])
            + ")", commit_stages)
    return prov
