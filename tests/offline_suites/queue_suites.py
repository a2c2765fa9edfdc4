"""Tiny suites registered only by the queue tests (and by the worker subprocess they start)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from offline_suites.base import Check, Method, RunContext, SuiteResult, method_impl
from offline_suites.jobs import TransientError
from offline_suites.registry import _suites, register_suite


@dataclass(frozen=True)
class QConfig:
    value: int = 1
    steps: int = 1
    sleep_s: float = 0.0
    marker: str = ""
    method: str = "value"
    run_seeds: int = 1
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {"value": (-1e9, 1e9), "steps": (0, 100_000), "run_seeds": (1, 20),
                                                        "sleep_s": (0.0, 60.0)}

    METHODS: ClassVar[dict[str, Method]]
    SMOKE: ClassVar[QConfig]
    FULL: ClassVar[QConfig]


QConfig.SMOKE = QConfig()
QConfig.FULL = QConfig(value=2, run_seeds=3)
QConfig.METHODS = {"value": Method("the configured value", lambda v: v),
                   "null": Method("the value is forced to 0", lambda v: 0)}


def _done(ctx: RunContext, cfg: QConfig) -> SuiteResult:
    value = method_impl(cfg)(cfg.value)
    ctx.save_json("value.json", {"value": value})
    return ctx.result({"value": value}, {}, [Check("value_positive", "gate", "> 0", value, 0, value > 0)])


def _register() -> None:
    if "qt-quick" in _suites:
        return

    @register_suite("qt-quick", version=1, config=QConfig, description="queue test: returns at once")
    def quick(ctx: RunContext, config: QConfig, seed: int) -> SuiteResult:
        ctx.progress(0.5, "half")
        return _done(ctx, config)

    @register_suite("qt-flaky", version=1, config=QConfig, description="queue test: always a transient error")
    def flaky(ctx: RunContext, config: QConfig, seed: int) -> SuiteResult:
        raise TransientError("model server unreachable (scripted)")

    @register_suite("qt-crash", version=1, config=QConfig, description="queue test: a deterministic bug")
    def crash(ctx: RunContext, config: QConfig, seed: int) -> SuiteResult:
        raise ValueError("scripted bug")

    @register_suite("qt-slow", version=1, config=QConfig, description="queue test: many progress steps")
    def slow(ctx: RunContext, config: QConfig, seed: int) -> SuiteResult:
        for i in range(config.steps):
            ctx.progress(i / config.steps, f"step {i}")
            time.sleep(config.sleep_s)
        return _done(ctx, config)

    @register_suite("qt-hang-once", version=1, config=QConfig,
                    description="queue test: the first attempt hangs (until its worker is killed)")
    def hang_once(ctx: RunContext, config: QConfig, seed: int) -> SuiteResult:
        marker = Path(config.marker)
        if not marker.exists():
            marker.write_text("first attempt started")
            for i in range(600):
                ctx.progress(i / 600, "hanging")
                time.sleep(0.1)
        return _done(ctx, config)


_register()
