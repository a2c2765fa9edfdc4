"""``nextguard`` command line: serve, benchmarks, and the subcommands of the guard, kernel and suite layers."""

from __future__ import annotations

import argparse
import importlib
import inspect
import ipaddress
import logging
import os
import sys
from collections.abc import Sequence

# Layers that contribute subcommands; each module exposes ``add_subcommands(subparsers)``.
# Listed explicitly so the command set is deterministic; a listed module that is missing is a bug.
SUBCOMMAND_MODULES = ("gateway.ops.cli", "guard.cli", "offline_suites.cli", "inference.pbs_attn.cli")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False        # a hostname or a wildcard resolves to who knows which interfaces


def exposure_problem(host: str, auth_enabled: bool) -> str | None:
    """Why serving on ``host`` would be unsafe, or None. Without API keys anyone who reaches the port can
    generate, read every tenant's jobs and, where granted, switch the guard off; only loopback is private."""
    if auth_enabled or is_loopback(host):
        return None
    return (
        f"refusing to serve on {host!r} without authentication: anyone who reaches this address could use "
        "the model and the jobs API. Turn keys on (NEXTGUARD_OPS__AUTH__ENABLED=true, then `nextguard keys "
        "create --tenant <name>`), bind to 127.0.0.1, or pass --insecure-no-auth if this network is private."
    )


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.config import Settings
    from gateway.main import create_app
    from gateway.redis_local import ensure_local_redis

    if args.model is not None:
        os.environ["NEXTGUARD_INFERENCE__MODEL"] = args.model
    settings = Settings()
    host = args.host or settings.server.host
    # --port 0: the OS picks a free port at bind time (uvicorn logs the one it got), so a launcher never
    # has to guess a port that someone else may take before the server binds it.
    port = settings.server.port if args.port is None else args.port
    problem = exposure_problem(host, settings.ops.auth.enabled)
    if problem is not None:
        if not args.insecure_no_auth:
            sys.stderr.write(problem + "\n")
            return 2
        logging.getLogger(__name__).warning("serving on %s WITHOUT authentication (--insecure-no-auth)", host)
    settings.server.host = host
    if port:
        settings.server.port = port
    if settings.redis.embedded:
        ensure_local_redis(settings.redis.url, settings.home / "redis")
    app = create_app(settings, exit_on_dead_engine=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=settings.server.log_level,
        timeout_graceful_shutdown=int(settings.server.drain_timeout_s),
    )
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from gateway.bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nextguard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible gateway")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None, help="0 = any free port (logged at start-up)")
    serve.add_argument("--model", default=None, help="HF model id or local folder (default: embedded SmolLM2)")
    serve.add_argument("--insecure-no-auth", action="store_true",
                       help="allow a non-loopback --host without API keys (a private network only)")
    serve.set_defaults(func=_serve)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    bs = bench_sub.add_parser("serve", help="gateway vs vLLM's own OpenAI server, same model, same run")
    bs.add_argument("--concurrency", type=int, default=8)
    bs.add_argument("--requests", type=int, default=32)
    bs.add_argument("--max-tokens", type=int, default=64)
    bs.add_argument("--model", default=None)
    bs.add_argument("--guard", choices=["off", "on"], default="off")
    bs.add_argument("--rounds", type=int, default=4, help="alternating rounds per server")
    bs.add_argument("--system", default=None,
                    help="a system message sent with every request (both servers): the guard then also reads the "
                         "user's message alone")
    bs.add_argument("--out", default=None, help="write the full report JSON here")
    bs.set_defaults(func=_bench_serve)

    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name):
                continue     # that layer is not part of this build yet
            raise
        n_params = len(inspect.signature(mod.add_subcommands).parameters)
        mod.add_subcommands(*(sub, bench_sub)[:n_params])
        if hasattr(mod, "add_bench_subcommands"):
            mod.add_bench_subcommands(bench_sub)
        if name == "guard.cli":
            from gateway.guard_eval import eval_extension

            if eval_extension not in mod.EVAL_EXTENSIONS:
                mod.EVAL_EXTENSIONS.append(eval_extension)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("NEXTGUARD_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
