"""``nextguard bench pbs [...]``: the PBS-Attn benchmark (same flags as ``python -m inference.pbs_attn.bench``)."""

from __future__ import annotations

import argparse
from typing import Any


def _run(args: argparse.Namespace) -> int:
    from inference.pbs_attn.bench import main  # torch is imported only when the command runs

    return main(list(args.pbs_args))


def add_subcommands(subparsers: Any, bench_subparsers: Any) -> None:
    """Called by ``gateway.cli``; PBS contributes only a benchmark."""
    p = bench_subparsers.add_parser(
        "pbs",
        help="PBS-Attn latency / density-recall / quality benchmark (pass --quick for the 16K/32K op rows)",
        prefix_chars="\0",  # hand every flag through to the benchmark's own parser
    )
    p.add_argument("pbs_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run)
