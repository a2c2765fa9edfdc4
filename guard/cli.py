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
