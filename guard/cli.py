"""``nextguard guard build|eval`` and ``nextguard bench guard`` (wired in by ``gateway/cli.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from guard.build import DEFAULT_ARTIFACTS, PRESETS


def _parse_overrides(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items or []:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _build(args: argparse.Namespace) -> int:
    from guard.build import build

    prov = build(args.out, base_model=args.base_model, preset=args.preset, overrides=_parse_overrides(args.set),
                 sae_source=args.sae)
    summary = {"sae": prov["sae"], "lora": {k: v for k, v in prov["lora"].items() if k != "verdict_token_ids"},
               "timings_s": prov["timings_s"]}
    sys.stdout.write(json.dumps(summary, default=str) + "\n")
    return 0


def _resae(args: argparse.Namespace) -> int:
    from guard.build import retrain_sae

    prov = retrain_sae(args.artifacts, base_model=args.base_model, overrides=_parse_overrides(args.set),
                       cache_dir=args.cache_dir)
    summary = {"sae": prov["sae"], "previous_sae": prov["sae_history"][-1]["sae"], "timings_s": prov["timings_s"],
               "calibration_f1": {n: {g: {mode: v["f1"] for mode, v in m[g]["calibration"].items()}
                                      for g in ("prompt", "response")} for n, m in prov["monitors"].items()}}
    sys.stdout.write(json.dumps(summary, default=str) + "\n")
    return 0


def _reselect(args: argparse.Namespace) -> int:
    from guard.build import reselect_monitors

    prov = reselect_monitors(args.artifacts, base_model=args.base_model, overrides=_parse_overrides(args.set))
    sys.stdout.write(json.dumps({n: {g: {mode: v["f1"] for mode, v in m[g]["calibration"].items()}
                                     for g in ("prompt", "response")} for n, m in prov["monitors"].items()}) + "\n")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from guard.evaluate import run_eval

    report = run_eval(args.artifacts, args.out, base_model=args.base_model, monitored=args.monitored,
                      limit=args.limit)
    sys.stdout.write(json.dumps(report["summary"], default=str) + "\n")
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
    b = gs.add_parser("build", help="fine-tune the safeguard, train the SAE, select features, calibrate")
    b.add_argument("--out", default=str(DEFAULT_ARTIFACTS))
    b.add_argument("--base-model", default=None, help="HF folder (default: the embedded SmolLM2)")
    b.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    b.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a BuildConfig field")
    b.add_argument("--sae", default=None, help="pretrained SAE instead of training one: dictionary_learning:<dir>, "
                   "sae_lens:<dir or release@id>, or a production name (guard.production)")
    b.set_defaults(func=_build)
    r = gs.add_parser("resae", help="retrain only the SAE of an existing build (its LoRA adapter, data and splits "
                      "are reused), then redo selection and calibration for every monitor")
    r.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
    r.add_argument("--base-model", default=None, help="HF folder (default: the embedded SmolLM2)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override an SAE field of BuildConfig (sae_tokens, sae_lr, sae_collect_tokens, ...)")
    r.add_argument("--cache-dir", default=None, help="keep the collected SAE training activations here for reruns")
    r.set_defaults(func=_resae)
    rs = gs.add_parser("reselect", help="redo only feature selection and calibration of an existing build")
    rs.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
    rs.add_argument("--base-model", default=None, help="HF folder (default: the embedded SmolLM2)")
    rs.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a selection field of BuildConfig (top_k, sigma, weight_scale, max_token_density, default_mode)")
    rs.set_defaults(func=_reselect)
    e = gs.add_parser("eval", help="sample-level F1, streaming timeliness, baselines; JSON + PNG report")
    e.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
    e.add_argument("--out", default="guard-eval")
    e.add_argument("--base-model", default=None)
    e.add_argument("--monitored", action="append", default=None, help="lora and/or base (default both)")
    e.add_argument("--limit", type=int, default=None, help="cap samples per gate (quick runs)")
    e.set_defaults(func=_eval)
    if bench_subparsers is not None:
        bg = bench_subparsers.add_parser("guard", help="monitor cost per token and guarded streaming throughput")
        bg.add_argument("--artifacts", default=str(DEFAULT_ARTIFACTS))
        bg.add_argument("--base-model", default=None)
        bg.add_argument("--streams", type=int, default=8)
        bg.add_argument("--tokens", type=int, default=64)
        bg.add_argument("--monitored", default="lora", choices=["lora", "base"])
        bg.add_argument("--out", default=None, help="write the full report JSON here")
        bg.set_defaults(func=_bench)
