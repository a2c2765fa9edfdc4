"""Fit the response gate's context term on a finished build, keeping every read-out it built.

The term's weight and the response threshold are chosen on the calibration split's answers
(:mod:`guard.recipe.response_context`); the read-outs, the SAE, the layer and the prompt gate stay as built.
Only those answers go through each monitored network (through the build's residual cache format, so an
interruption resumes), a fraction of the full build's forward. The build's record says when the term was
fitted and from which grid; a later full build fits it again as its monitor stage does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guard.bundle import MonitorSpec
from guard.recipe.pipeline import default_work_dir
from guard.recipe.prompt_gate import PartRefit, open_finished_build, refit_each_monitor
from guard.recipe.response_context import cache_rows, context_scores, fit_context_term, with_response_gate

log = logging.getLogger(__name__)

CONTEXT_FIELDS = frozenset({"response_context_grid", "threads"})


def refit_response_context(out_dir: str | Path, base_model: str | Path | None = None, preset: str = "cpu",
                           work_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                           commit_stages: bool = False) -> dict[str, Any]:
    """Fit every monitor's response context term in ``out_dir`` (a finished build); returns the provenance."""
    fb = open_finished_build(out_dir, base_model, preset, overrides, CONTEXT_FIELDS, "response context term")
    cfg, layer = fb.cfg, int(fb.manifest["layer"])
    if not cfg.response_context_grid:
        raise ValueError("response_context_grid is empty: there is no context term to fit")
    work = Path(work_dir) if work_dir is not None else default_work_dir(preset)
    work.mkdir(parents=True, exist_ok=True)
    cal = [s for s in fb.dataset.splits["calib"] if s.gate == "response"]

    def fit(name: str, model: Any, tok: Any, spec: MonitorSpec, progress: Callable[[float], None]
            ) -> tuple[MonitorSpec, dict[str, Any]]:
        cache = fb.monitor_cache(name, model, tok, cal, work / "cache" / f"response-context-{name}", progress)
        ctx = context_scores(spec, cache_rows(cache, layer, spec, tok, cal, list(range(len(cal)))))
        gate, crec = fit_context_term(spec, cal, ctx, cfg.budget_response, cfg.response_context_grid)
        return with_response_gate(spec, gate), crec

    record: dict[str, Any] = {"grid": [list(t) for t in cfg.response_context_grid], "layer": layer,
                              "calibration_answers": len(cal)}
    return refit_each_monitor(
        fb, PartRefit("response", "context", "context", "guard build: response context term fitted"), fit, record,
        lambda crec, seconds: {"seconds": seconds, "chosen": crec["chosen"], "without": crec["tried"][0]},
        commit_stages)
