"""``nextguard guard build|eval`` and ``nextguard bench guard`` (wired in by ``gateway/cli.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from guard.ladder import LOSO_PARTS
from guard.recipe.pipeline import DEFAULT_ARTIFACTS, PRESETS


def _parse_overrides(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items or []:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _apply(cfg: Any, overrides: dict[str, Any]) -> Any:
    """Overrides with dotted keys into the nested build config (``head.l2=0.001``, ``data.n_everyday=100``)."""
    from dataclasses import fields, is_dataclass, replace

    out = cfg
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        names = {f.name for f in fields(out)}
        if head not in names:
            import difflib

            close = difflib.get_close_matches(head, names, n=1)
            raise SystemExit(f"unknown build setting '{key}'" + (f"; did you mean '{close[0]}'?" if close else ""))
        if rest:
            sub = getattr(out, head)
            if not is_dataclass(sub):
                raise SystemExit(f"build setting '{head}' has no fields")
            out = replace(out, **{head: _apply(sub, {rest: value})})
        else:
            out = replace(out, **{head: tuple(value) if isinstance(value, list) else value})
    return out


def _build(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from guard.recipe.pipeline import PRESETS, build

    cfg = _apply(PRESETS[args.preset], _parse_overrides(args.set))
    only = (args.prompt_gate_only, args.response_context_only, args.response_probe_only, args.prompt_probe_only,
            args.response_gate_only)
    if sum(only) > 1:
        raise SystemExit("--prompt-gate-only, --prompt-probe-only, --response-gate-only, --response-context-only and "
                         "--response-probe-only refit different parts: run them one after the other")
    if args.dataset is not None and any(only) and not args.response_gate_only:
        raise SystemExit("--dataset with a one-part refit is for --response-gate-only (new answers, the same requests); "
                         "the other refits fit on the build's own dataset")
    if args.response_gate_only:
        from guard.recipe.response_gate import refit_response_gate

        prov = refit_response_gate(args.out, base_model=args.base_model, preset=args.preset, work_dir=args.work_dir,
                                   overrides={f.name: getattr(cfg, f.name) for f in fields(cfg)},
                                   commit_stages=args.commit_stages, dataset=args.dataset)
        sys.stdout.write(json.dumps(prov["response_gate_refits"][-1], default=str) + "\n")
        return 0
    if any(only):
        # a refit of one part of a finished build, and the provenance list its record is appended to
        if args.prompt_probe_only:
            from guard.recipe.prompt_probe import refit_prompt_probe as refit
            records = "prompt_probe_refits"
        elif args.response_context_only:
            from guard.recipe.context_refit import refit_response_context as refit
            records = "context_refits"
        elif args.response_probe_only:
            from guard.recipe.residual_probe import refit_response_probe as refit
            records = "probe_refits"
        else:
            from guard.recipe.prompt_gate import refit_prompt_gate as refit
            records = "prompt_refits"
        prov = refit(args.out, base_model=args.base_model, preset=args.preset, work_dir=args.work_dir,
                     overrides={f.name: getattr(cfg, f.name) for f in fields(cfg)}, commit_stages=args.commit_stages)
        sys.stdout.write(json.dumps(prov[records][-1], default=str) + "\n")
        return 0
    prov = build(args.out, base_model=args.base_model, preset=args.preset, work_dir=args.work_dir,
                 overrides={f.name: getattr(cfg, f.name) for f in fields(cfg)}, dataset=args.dataset,
                 commit_stages=args.commit_stages)
    summary = {"layer": prov["layer"], "layers": prov["layers"], "sae": prov["sae"].get("per_layer"),
               "safeguard": {k: prov["safeguard"][k] for k in ("steps_run", "best_step", "best_val_loss")},
               "monitors": {n: {g: m[g]["chosen"] for g in ("prompt", "response")} for n, m in prov["monitors"].items()},
               "timings_s": prov["timings_s"]}
    sys.stdout.write(json.dumps(summary, default=str) + "\n")
    return 0


def _refresh(args: argparse.Namespace) -> int:
    from pathlib import Path

    from guard.recipe import data as DATA
    from guard.recipe.pipeline import PRESETS, default_work_dir

    cfg = _apply(PRESETS[args.preset], _parse_overrides(args.set))
    src = Path(args.dataset)
    ds = DATA.load_dataset(src)
    work = Path(args.work_dir) if args.work_dir else default_work_dir(args.preset)
    new = DATA.refresh_family(ds, args.family, cfg.data, work, model=args.base_model)
    out = Path(args.out or src)
    info = DATA.write_dataset(new, out)
    sys.stdout.write(json.dumps({"out": str(out), "splits": info}) + "\n")
    return 0


def _probe_depth(args: argparse.Namespace) -> int:
    from guard.evaluate import run_probe_depth

    rep = run_probe_depth(args.artifacts, args.out, depths=args.depths, base_model=args.base_model,
                          adapter=args.adapter, skip_sets=args.skip_set or ())
    sys.stdout.write(json.dumps({layer: {k: r[k] for k in ("mean_pair_balanced_accuracy", "test_balanced_accuracy")}
                                 for layer, r in rep["depths"].items()}) + "\n")
    return 0


SKIP_SET_HELP = "a held-out prompt set this run leaves unscored (repeatable): a blind pair kept for judging a later change"

# Sections that other layers add to ``guard eval`` (the gateway registers the everyday streams through a
# real server): each gets the parsed arguments and the report so far and returns keys to merge in.
EVAL_EXTENSIONS: list[Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = []


def _eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from guard.evaluate import run_eval

    report = run_eval(args.artifacts, args.out, base_model=args.base_model, monitored=args.monitored,
                      limit=args.limit, posthoc=not args.no_posthoc, drift_annotation=args.drift_annotation,
                      skip_sets=args.skip_set or ())
    if args.ladder:
        from guard.evaluate import run_ladder_eval

        lad = run_ladder_eval(args.artifacts, args.out, work_dir=args.work_dir, base_model=args.base_model,
                              layers=args.layers, posthoc=not args.no_posthoc, drift_annotation=args.drift_annotation,
                              loso=not args.no_loso, loso_families=args.loso_families, skip_sets=args.skip_set or (),
                              loso_parts=args.loso_parts)
        report["ladder"] = lad
    for ext in EVAL_EXTENSIONS:
        report.update(ext(args, report))
    summary = dict(report["summary"])
    if "everyday_gateway" in report:
        summary["everyday_gateway"] = {k: report["everyday_gateway"][k] for k in
                                       ("n_prompts", "moderation_flagged", "streams_refused", "streams_cut")}
    if "ladder" in report:
        lad = report["ladder"]
        summary["ladder_where_signal_is_lost"] = {k: v[0] for k, v in lad["ladder"]["where_signal_is_lost"].items() if v}
        summary["fresh_prompts"] = lad["fresh"]
    report["summary"] = summary
    (Path(args.out) / "report.json").write_text(json.dumps(report, indent=1, default=str))
    sys.stdout.write(json.dumps(summary, default=str) + "\n")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from guard.bench import run_bench

    res = run_bench(args.artifacts, base_model=args.base_model, streams=args.streams, tokens=args.tokens,
                    monitored=args.monitored, out=args.out)
    sys.stdout.write(json.dumps(res, default=str) + "\n")     # the JSON line is printed last
    return 0


def add_subcommands(subparsers: Any, bench_subparsers: Any | None = None) -> None:
    g = subparsers.add_parser("guard", help="NExT-Guard monitor: build artifacts, evaluate")
    gs = g.add_subparsers(dest="guard_command", required=True)
    b = gs.add_parser("build", help="data, safeguard, SAEs, read-outs, thresholds (about 2 h on 2 CPU cores)")
    b.add_argument("--out", default=str(DEFAULT_ARTIFACTS))
    b.add_argument("--base-model", default=None, help="HF folder (default: the embedded SmolLM2)")
    b.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    b.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a build setting, dotted for nested ones (head.l2=0.001, data.n_everyday=100)")
    b.add_argument("--dataset", default=None,
                   help="reuse a dataset file (e.g. a published data.jsonl.gz) instead of generating answers")
    b.add_argument("--work-dir", default=None, help="stage outputs kept for resuming (default $NEXTGUARD_HOME/guard-build/<preset>)")
    b.add_argument("--commit-stages", action="store_true",
                   help="git-commit each finished stage's outputs (LoRA, SAEs, read-outs) so a cut build resumes elsewhere")
    b.add_argument("--prompt-gate-only", action="store_true",
                   help="refit only the prompt gate of the finished build in --out, from its own dataset (forwards the "
                        "prompt samples alone; the safeguard, SAE, layer and response gate stay as built)")
    b.add_argument("--prompt-probe-only", action="store_true",
                   help="fit only the prompt gate's residual probe of the finished build in --out, added to its "
                        "read-out's score (forwards the prompts alone; every read-out stays as built)")
    b.add_argument("--response-context-only", action="store_true",
                   help="fit only the response gate's context term of the finished build in --out (forwards the "
                        "calibration answers alone; every read-out stays as built)")
    b.add_argument("--response-gate-only", action="store_true",
                   help="refit only the response gate of the finished build in --out (read-out, context term and "
                        "residual probe; forwards the select and calibration answers alone), on --dataset when given: "
                        "a dataset whose requests are the build's (e.g. after refresh-data drift)")
    b.add_argument("--response-probe-only", action="store_true",
                   help="fit only the response gate's residual probe of the finished build in --out (forwards the "
                        "select and calibration answers alone; every read-out and the context term stay as built)")
    b.set_defaults(func=_build)
    r = gs.add_parser("refresh-data", help="regenerate one prompt family's rows of a dataset after its prompt list changed, "
                                           "or its drift streams after their rule changed")
    r.add_argument("family", help="the prompt family (sensitive), or drift (the drift streams, from the dataset's answers)")
    r.add_argument("--dataset", default=str(DEFAULT_ARTIFACTS / "data.jsonl.gz"))
    r.add_argument("--out", default=None, help="where to write the new dataset (default: over --dataset)")
    r.add_argument("--base-model", default=None, help="HF folder (default: the embedded SmolLM2)")
    r.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a build setting (data.max_tokens=256)")
    r.add_argument("--work-dir", default=None, help="where generated answers are cached for resuming")
    r.set_defaults(func=_refresh)
    e = gs.add_parser("eval", help="sample-level F1, streaming timeliness, baselines; JSON + PNG report")
    e.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
    e.add_argument("--out", default="guard-eval")
    e.add_argument("--base-model", default=None)
    e.add_argument("--monitored", action="append", default=None, help="lora and/or base (default both)")
    e.add_argument("--limit", type=int, default=None, help="cap samples per kind (quick runs)")
    e.add_argument("--ladder", action="store_true",
                   help="also the ladder per candidate layer (verdict, dense probes, SAE probe, sparse read-out, paper's "
                        "rule, keywords), leave-one-source-out and the fresh prompt sets; reads the build's residual cache")
    e.add_argument("--work-dir", default=None, help="the build's work folder holding the residual cache")
    e.add_argument("--layers", type=int, nargs="*", default=None, help="candidate layers for the ladder (default all)")
    e.add_argument("--no-loso", action="store_true", help="leave leave-one-source-out out of the ladder")
    e.add_argument("--loso-families", nargs="*", default=None, metavar="FAMILY",
                   help="leave out only these source families (templates/pair, pyrit/scorer_evals, …; default every "
                        "family with enough select samples)")
    e.add_argument("--loso-parts", nargs="+", default=list(LOSO_PARTS), choices=LOSO_PARTS,
                   help="which leave-outs run: each gate refitted on its own (gates), both gates together and "
                        "scored as a conversation meets them (end_to_end)")
    e.add_argument("--drift-annotation", default=None,
                   help="hand annotation of the test split's drift streams (guard/eval_report/"
                        "drift-test-unsafe-parts-annotated.json): report them apart by whether their unsafe part is "
                        "harmful in its own words")
    e.add_argument("--no-gateway", action="store_true", help="skip the everyday streams through a real gateway")
    e.add_argument("--everyday-max-tokens", type=int, default=512, help="answer length of the everyday streams")
    e.add_argument("--no-posthoc", action="store_true",
                   help="leave out the safeguard's own post-hoc verdict (it reads the LoRA alone, not the monitor)")
    e.add_argument("--skip-set", action="append", default=None, metavar="SET",
                   help=SKIP_SET_HELP)
    e.set_defaults(func=_eval)
    pd = gs.add_parser("probe-depth", help="the prompt gate's dense probe at every depth of the safeguard, on the held-out "
                                           "prompt sets, with a learning curve: what any linear read of the residual holds")
    pd.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
    pd.add_argument("--out", default="guard-eval")
    pd.add_argument("--base-model", default=None)
    pd.add_argument("--depths", type=int, nargs="*", default=None, help="layers to probe (default every layer)")
    pd.add_argument("--adapter", default=None,
                    help="another LoRA folder to read instead of the build's (a retrained safeguard, before its SAE)")
    pd.add_argument("--skip-set", action="append", default=None, metavar="SET",
                    help=SKIP_SET_HELP)
    pd.set_defaults(func=_probe_depth)
    if bench_subparsers is not None:
        bg = bench_subparsers.add_parser("guard", help="monitor cost per token and guarded streaming throughput")
        bg.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
        bg.add_argument("--base-model", default=None)
        bg.add_argument("--streams", type=int, default=8)
        bg.add_argument("--tokens", type=int, default=64)
        bg.add_argument("--monitored", default="lora", choices=["lora", "base"])
        bg.add_argument("--out", default=None, help="write the full report JSON here")
        bg.set_defaults(func=_bench)
