"""Refit the response gate of a finished build, keeping its safeguard, SAE, layer and prompt gate.

The response gate is the only part fitted on the dataset's answers. When the answers' rows change and the
requests' rows do not (the drift streams rebuilt by a new rule: ``nextguard guard refresh-data drift``), the
prompt gate, fitted on the requests alone, stays valid, and so do the unsupervised parts; only the response
gate has to be fitted again. This forwards the select and calibration answers alone through each monitored
network (resumable, in the residual cache format), encodes them with the build's SAE, and fits the response
gate as the build's monitor stage does: the read-out variants of the response grid compared on the
calibration split (:func:`guard.recipe.pipeline.fit_monitor` with ``gates=("response",)``), then the context
term, then the residual probe.

With a new dataset, the build's record names what was kept from the old one: the safeguard adapter and the
SAE were trained on the previous rows (their records keep those rows' hashes, so a later full build retrains
both on the new ones).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from guard.bundle import MonitorSpec
from guard.recipe import data as DATA
from guard.recipe.pipeline import default_work_dir, fit_monitor
from guard.recipe.prompt_gate import PartRefit, open_finished_build, refit_each_monitor
from guard.recipe.response_context import (
    cache_rows,
    context_scores,
    fit_context_term,
    served_rank,
    with_response_gate,
)
from guard.recipe.sources import data_hash

log = logging.getLogger(__name__)

RESPONSE_GATE_FIELDS = frozenset({"response_head_grid", "budget_response", "response_context_grid", "response_probe",
                                  "response_probe_fit", "response_probe_c", "threads"})


def check_requests_unchanged(old: DATA.Dataset, new: DATA.Dataset) -> dict[str, Any]:
    """What differs between two datasets, refused unless it is answers alone: the requests' rows (what the prompt
    gate was fitted and calibrated on) must be the same, split by split."""
    for split in DATA.SPLITS:
        a = [s for s in old.splits[split] if s.gate == "prompt"]
        b = [s for s in new.splits[split] if s.gate == "prompt"]
        if data_hash(a) != data_hash(b):
            raise ValueError(f"the new dataset's {split} requests differ from the build's: the prompt gate was "
                             "fitted on them; run a full `nextguard guard build --dataset ...`")
    keys = {split: {s.key(): s for s in old.splits[split]} for split in DATA.SPLITS}
    out: dict[str, Any] = {}
    for split in DATA.SPLITS:
        new_keys = {s.key() for s in new.splits[split]}
        out[split] = {"answers_removed": len(set(keys[split]) - new_keys),
                      "answers_added": len(new_keys - set(keys[split]))}
    return out


def refit_response_gate(out_dir: str | Path, base_model: str | Path | None = None, preset: str = "cpu",
                        work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                        commit_stages: bool = False, dataset: str | Path | None = None) -> dict[str, Any]:
    """Refit every monitor's response gate in ``out_dir`` (a finished build), on ``dataset`` when given (which
    then becomes the build's dataset); returns the updated provenance."""
    from guard.recipe.encode import encode_cached
    from guard.recipe.residual_probe import fit_residual_probe
    from guard.sae import load_sae

    fb = open_finished_build(out_dir, base_model, preset, overrides, RESPONSE_GATE_FIELDS, "response gate")
    cfg, layer = fb.cfg, int(fb.manifest["layer"])
    record: dict[str, Any] = {"layer": layer}
    new_data = None
    if dataset is not None:
        new_data = DATA.load_dataset(Path(dataset))
        record["data"] = {"changed": check_requests_unchanged(fb.dataset, new_data),
                          "kept_from_previous_rows": ["safeguard adapter", "SAE", "layer choice", "prompt gate"],
                          "previous_splits": {k: v["sha256"] for k, v in fb.prov["data"]["splits"].items()}}
        fb = replace(fb, dataset=new_data)
    work = Path(work_dir) if work_dir is not None else default_work_dir(preset)
    work.mkdir(parents=True, exist_ok=True)
    answers, sel_idx, cal_idx = fb.answers()
    sel, cal = answers[:len(sel_idx)], answers[len(sel_idx):]
    record["answers"] = {"select": len(sel), "calib": len(cal)}
    sae = load_sae(fb.out / "sae")

    def fit(name: str, model: Any, tok: Any, spec: MonitorSpec, progress: Callable[[float], None]
            ) -> tuple[MonitorSpec, dict[str, Any]]:
        # the same answers and folder as the residual-probe refit, so either resumes the other's forward
        cache = fb.monitor_cache(name, model, tok, answers, work / "cache" / f"response-probe-{name}",
                                 lambda share: progress(0.75 * share))
        td = {"select": encode_cached(cache, sae, layer, sel_idx), "calib": encode_cached(cache, sae, layer, cal_idx)}
        progress(0.6)
        rank = None
        if cfg.response_context_grid:
            # the variants rank as served: each with its own best context term, against this monitor's prompt gate
            by_served = served_rank(spec.gates["prompt"], sae, cache, layer, tok, answers, cal_idx, cfg.budget_response,
                                    cfg.response_context_grid)

            def rank(_: dict[str, Any], f: Any) -> tuple[float, ...]:
                return by_served(f.spec)
        fits, rep = fit_monitor({"response": td["select"]}, {"response": sel}, {"response": td["calib"]},
                                {"response": cal}, cfg, grid=True, gates=("response",), response_rank=rank)
        del td
        progress(0.8)
        new = MonitorSpec.from_gates({"prompt": spec.gates["prompt"], "response": fits["response"].spec}, sae, name,
                                     spec.info, {"prompt": spec.reference["prompt"],
                                                 "response": fits["reference/response"].spec})
        # the prompt gate's residual probe keeps its encoder column
        pg = spec.gates["prompt"]
        if pg.probe is not None:
            cols = [spec.encoder.probe_ids.index(i) for i in pg.probe.ids]
            new = replace(new, encoder=new.encoder.with_probes(spec.encoder.probe_W[:, cols], list(pg.probe.ids)))
        part = rep["response"]
        if cfg.response_context_grid:
            ctx = context_scores(new, cache_rows(cache, layer, new, tok, answers, cal_idx))
            gate, part["context"] = fit_context_term(new, cal, ctx, cfg.budget_response, cfg.response_context_grid)
            new = with_response_gate(new, gate)
        progress(0.9)
        if cfg.response_probe:
            new, part["probe"] = fit_residual_probe(new, cache, layer, tok, answers, sel_idx, cal_idx,
                                                    cfg.budget_response, cfg.response_probe_fit, cfg.response_probe_c)
        return new, part

    def summary(part: dict[str, Any], seconds: float) -> dict[str, Any]:
        return {"seconds": seconds, "chosen": part["chosen"], "chosen_head": part["chosen_head"],
                "context": part.get("context", {}).get("chosen"),
                "probe": {k: v for k, v in part.get("probe", {}).items() if k != "seconds"}}

    return refit_each_monitor(
        fb, PartRefit("response", "", "response_gate", "guard build: response gate refitted"
                      + (" on the new dataset" if new_data is not None else ""), minutes=25.0),
        fit, record, summary, commit_stages, dataset=new_data)
