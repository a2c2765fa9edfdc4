"""``nextguard suites list|run|submit`` and ``nextguard worker``.

``suites run`` executes in this process (no Redis) and prints the SuiteResult JSON as the last
output; it exits 0 only if every gate passed. ``suites submit`` goes through the gateway API
and shows a progress bar until the run finishes. ``worker`` starts N arq workers on this machine;
run it on M machines against one Redis to scale out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _out(text: str, stream: Any = None) -> None:
    """CLI output (stdout by default); the JSON result is always the last line written."""
    (stream or sys.stdout).write(text + "\n")
    (stream or sys.stdout).flush()


def add_subcommands(subparsers: Any) -> None:
    suites = subparsers.add_parser("suites", help="offline evaluation suites")
    ssub = suites.add_subparsers(dest="suites_command", required=True)

    ls = ssub.add_parser("list", help="registered suites with versions and presets")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_list)

    run = ssub.add_parser("run", help="run one suite in this process (no Redis)")
    run.add_argument("name")
    run.add_argument("--preset", choices=["smoke", "full"], default="smoke")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--config", default=None, help="JSON object of config overrides")
    run.add_argument("--json", action="store_true", help="print only the SuiteResult JSON (last line)")
    run.add_argument("--out", default=None, help="artifact folder (default: <results_dir>/local/<name>-<seed>)")
    run.add_argument("--llm", choices=["engine", "api"], default=None,
                     help="how LLM-facing suites reach the model (default: suites.llm_backend)")
    run.set_defaults(func=_run)

    sub = ssub.add_parser("submit", help="submit a run through the gateway API and follow it")
    sub.add_argument("name")
    sub.add_argument("--preset", choices=["smoke", "full"], default="smoke")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument("--config", default=None, help="JSON object of config overrides")
    sub.add_argument("--url", default=None, help="gateway base URL (default: suites.api_base_url)")
    sub.add_argument("--no-wait", action="store_true", help="print the run object and return")
    sub.add_argument("--json", action="store_true")
    sub.set_defaults(func=_submit)

    worker = subparsers.add_parser("worker", help="run suite/batch workers against the configured Redis")
    worker.add_argument("--processes", type=int, default=1, help="worker processes on this machine")
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.set_defaults(func=_worker)


def _list(args: argparse.Namespace) -> int:
    from offline_suites.registry import list_suites

    infos = [s.info() for s in list_suites()]
    if args.json:
        _out(json.dumps(infos, indent=1))
    else:
        for i in infos:
            _out(f"{i['name']:<18} v{i['version']}  {i['description'][:90]}")
    return 0


def _progress_bar(desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=100, desc=desc, file=sys.stderr, bar_format="{l_bar}{bar}| {n:.0f}% {postfix}",
                disable=not sys.stderr.isatty())


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from offline_suites.base import RunContext, build_config
    from offline_suites.config import SuitesEnv, suite_engine_settings
    from offline_suites.llm import BackgroundEngine, build_openai_client
    from offline_suites.registry import get_suite

    env = SuitesEnv()
    suite = get_suite(args.name)
    config = build_config(suite.config_cls, args.preset, json.loads(args.config) if args.config else None)
    out = Path(args.out) if args.out else env.suites.results_dir / "local" / f"{suite.name}-{args.preset}-{args.seed}"
    backend = args.llm or env.suites.llm_backend
    holder: dict[str, Any] = {}

    def llm_factory() -> Any:
        if backend == "api":
            return build_openai_client(env.suites)
        from inference.vllm_engine import VLLMEngineClient

        holder["bg"] = BackgroundEngine(lambda: VLLMEngineClient.from_settings(suite_engine_settings(env.inference, env.suites)))
        return holder["bg"].client()

    bar = _progress_bar(suite.name)

    def on_progress(frac: float, msg: str) -> None:
        bar.n = round(100 * frac, 1)
        bar.set_postfix_str(msg[:40])
        bar.refresh()

    ctx = RunContext(results_dir=out, llm_factory=llm_factory, on_progress=on_progress)
    try:
        result = suite.run(ctx, config, args.seed)
    finally:
        bar.close()
        if "bg" in holder:
            holder["bg"].close()
    body = result.to_dict()
    if not args.json:
        for c in body["checks"]:
            mark = "PASS" if c["passed"] else "FAIL"
            _out(f"{mark} {c['kind']} {c['name']}: observed={c['observed']} expected={c['expected']}")
        for c in body["claims"]:
            obs = "n/a" if c["observed"] is None else f"{c['observed']:.4g}"
            ci = "none" if c["ci95"] is None else f"[{c['ci95'][0]:.4g}, {c['ci95'][1]:.4g}]"
            _out(f"CLAIM {c['verdict']}: {c['name']}: {c['statement']} (mean {obs} over "
                 f"{len(c['per_seed'])} seed(s), 95% CI {ci}; paper {c['direction']} {c['threshold']:.4g}, "
                 f"target {c['target']:.4g}; {c['reason']})")
        _out(f"artifacts in {out}")
    _out(json.dumps(body))
    return 0 if result.gates_passed else 1


def _submit(args: argparse.Namespace) -> int:
    import httpx

    from offline_suites.config import SuitesEnv

    env = SuitesEnv()
    base = (args.url or env.suites.api_base_url).rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    headers = {"Authorization": f"Bearer {env.suites.api_key}"}
    payload = {"preset": args.preset, "seed": args.seed, "config": json.loads(args.config) if args.config else {}}
    with httpx.Client(timeout=60, headers=headers) as client:
        r = client.post(f"{base}/suites/{args.name}/runs", json=payload)
        if r.status_code >= 400:
            _out(r.text, sys.stderr)
            return 2
        run = r.json()
        if args.no_wait:
            _out(json.dumps(run))
            return 0
        bar = _progress_bar(f"{args.name} {run['id'][:8]}")
        while run["status"] in ("queued", "running"):
            time.sleep(1.0)
            run = client.get(f"{base}/runs/{run['id']}").json()
            bar.n = round(100 * float(run.get("progress") or 0), 1)
            bar.set_postfix_str(f"{run['status']} {run.get('message', '')[:30]}")
            bar.refresh()
        bar.close()
    _out(json.dumps(run))
    ok = run["status"] == "succeeded" and (run.get("result") or {}).get("summary", {}).get("gates_passed", False)
    return 0 if ok else 1


def _worker_main(burst: bool) -> None:
    from offline_suites.config import SuitesEnv, suite_engine_settings
    from offline_suites.worker import main_worker

    env = SuitesEnv()
    main_worker(env.suites, env.redis.url, inference_settings=suite_engine_settings(env.inference, env.suites),
                burst=burst)


def _worker(args: argparse.Namespace) -> int:
    if args.processes <= 1:
        _worker_main(args.burst)
        return 0
    import multiprocessing as mp

    ctx = mp.get_context("spawn")          # no forked engine/torch state between workers
    procs = [ctx.Process(target=_worker_main, args=(args.burst,), name=f"suite-worker-{i}")
             for i in range(args.processes)]
    for p in procs:
        p.start()
    code = 0
    for p in procs:
        p.join()
        code = code or (p.exitcode or 0)
    return code
