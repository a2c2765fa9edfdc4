"""Fit the response gate's context term on a finished build, keeping every read-out it built.

The term's weight and the response threshold are chosen on the calibration split's answers
(:mod:`guard.recipe.response_context`); the read-outs, the SAE, the layer and the prompt gate stay as built.
Only those answers go through each monitored network (through the build's residual cache format, so an
interruption resumes), a fraction of the full build's forward. The build's record says when the term was
fitted and from which grid; a later full build fits it again as its monitor stage does.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

from guard.bundle import MonitorSpec
from guard.recipe.pipeline import (
    Progress,
    _commit,
    _hash,
    default_work_dir,
    monitored_id,
)
from guard.recipe.prompt_gate import open_finished_build
from guard.recipe.response_context import cache_rows, context_scores, fit_context_term, with_response_gate

log = logging.getLogger(__name__)

CONTEXT_FIELDS = frozenset({"response_context_grid", "threads"})


def refit_response_context(out_dir: str | Path, base_model: str | Path | None = None, preset: str = "cpu",
                           work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                           commit_stages: bool = False) -> dict[str, Any]:
    """Fit every monitor's response context term in ``out_dir`` (a finished build); returns the provenance."""
    import torch

    from guard.hardware import build_dtype
    from guard.recipe.cache import build_cache
    from guard.runner import load_guard_model

    fb = open_finished_build(out_dir, base_model, preset, overrides, CONTEXT_FIELDS, "response context term")
    out, prov, man, cfg, new_cfg, base_model, ds = (fb.out, fb.prov, fb.manifest, fb.cfg, fb.new_cfg, fb.base_model,
                                                    fb.dataset)
    if not cfg.response_context_grid:
        raise ValueError("response_context_grid is empty: there is no context term to fit")
    prov_f = out / "provenance.json"
    # the monitors' dtype where this CPU runs it natively, fp32 elsewhere (the cache keeps bf16 rows either way)
    dtype, layer = build_dtype(str(man["dtype"])), int(man["layer"])
    work = Path(work_dir) if work_dir is not None else default_work_dir(preset)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)

    cal = [s for s in ds.splits["calib"] if s.gate == "response"]
    names = [str(m) for m in man["monitors"]]
    prog = Progress({f"context_{n}": 5.0 for n in names})
    t_all = time.time()
    record: dict[str, Any] = {"grid": [list(t) for t in cfg.response_context_grid], "layer": layer, "dtype": dtype,
                              "calibration_answers": len(cal), "monitors": {}}
    for name in names:
        stage = f"context_{name}"
        prog.start(stage)
        t0 = time.time()
        adapter = out / "lora" if name == "lora" else None
        model, tok = load_guard_model(base_model, adapter, dtype=dtype)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        net_id = monitored_id(str(prov.get("base_model")), adapter)
        cache = build_cache(model, tok, cal, (layer,), work / "cache" / f"response-context-{name}", model_id=net_id,
                            max_tokens=cfg.max_tokens, dtype=dtype,
                            progress=lambda d, n, st=stage: prog.update(st, 0.8 * d / n))
        del model
        spec = MonitorSpec.load(out / "monitors" / name, name)
        ctx = context_scores(spec, cache_rows(cache, layer, spec, tok, cal, list(range(len(cal)))))
        gate, crec = fit_context_term(spec, cal, ctx, cfg.budget_response, cfg.response_context_grid)
        with_response_gate(spec, gate).save(out / "monitors" / name)
        rec_f = out / "monitors" / name / "build.json"
        rec = json.loads(rec_f.read_text()) if rec_f.is_file() else {"report": {}}
        rec["report"].setdefault("response", {})["context"] = crec
        seconds = time.time() - t0
        rec = {"key": "context-refit:" + _hash([rec.get("key"), new_cfg]), "report": rec["report"],
               "context_refit": {"previous_key": rec.get("key"), "seconds": seconds}}
        rec_f.write_text(json.dumps(rec, default=str))
        prov.setdefault("monitors", {}).setdefault(name, {}).setdefault("response", {})["context"] = crec
        record["monitors"][name] = {"seconds": seconds, "chosen": crec["chosen"], "without": crec["tried"][0]}
        prog.finish(stage)
    record.update(seconds=time.time() - t_all, machine=platform.platform(),
                  created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    prov["config"] = new_cfg
    prov.setdefault("context_refits", []).append(record)
    prov_f.write_text(json.dumps(prov, indent=1, default=str))
    _commit([out / "monitors", prov_f], "guard build: response context term fitted", commit_stages)
    return prov
