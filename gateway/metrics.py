"""Every Prometheus object the gateway owns. Serving code fills a ``StreamStats`` and calls
:func:`record`; nothing else touches ``prometheus_client`` directly.

vLLM's own ``vllm:*`` metrics live in the same default registry (the in-process engine registers
them), so ``/metrics`` shows both. With several uvicorn workers set ``PROMETHEUS_MULTIPROC_DIR`` (to an
empty directory, before the first import of ``prometheus_client``): every gauge below declares how its
per-process values combine (``multiprocess_mode``), and :func:`render` merges the workers' files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:     # the serving code imports this module to count what it refuses
    from gateway.serving.common import StreamStats

# Ladders follow vLLM's TTFT / TPOT buckets so gateway and engine panels line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)

REQUESTS = Counter("gateway_requests_total", "Requests by route and HTTP status", ["route", "status"])
TTFT = Histogram(
    "gateway_time_to_first_token_seconds", "Arrival to first content token sent", ["model"], buckets=TTFT_BUCKETS
)
ITL = Histogram("gateway_inter_token_latency_seconds", "Time between content tokens sent", ["model"], buckets=ITL_BUCKETS)
E2E = Histogram("gateway_request_seconds", "Arrival to last byte", ["route"], buckets=TTFT_BUCKETS)
PROMPT_TOKENS = Counter("gateway_prompt_tokens_total", "Prompt tokens", ["model"])
COMPLETION_TOKENS = Counter("gateway_completion_tokens_total", "Completion tokens sent to clients", ["model"])
FINISH = Counter("gateway_finish_total", "Finished choices by finish_reason", ["model", "finish_reason"])
GUARD_DECISIONS = Counter(
    "gateway_guard_decisions_total", "Guard decisions (a cut is 'intervened', never an error)", ["decision", "category", "model"]
)
CUT_POSITION = Histogram("gateway_cut_position_tokens", "Generated tokens before a cut", ["model"], buckets=TOKEN_BUCKETS)
DISCONNECTS = Counter("gateway_client_disconnects_total", "Clients that went away mid-stream", ["route"])
UPSTREAM_ABORTS = Counter("gateway_upstream_aborts_total", "Engine requests aborted by the gateway", ["reason"])
ERRORS = Counter("gateway_errors_total", "Errors after the response started", ["stage"])
ENGINE_RUNNING = Gauge(
    "gateway_engine_requests_running", "Requests inside the engine (running or waiting)", multiprocess_mode="livesum"
)
# --- operations (gateway.ops / admission / guard chain) ---
GUARD_STEP = Histogram(
    "gateway_guard_step_seconds",
    "Engine token arrival to its release by the guard (scoring plus hold-back wait)",
    ["model"],
    buckets=ITL_BUCKETS,
)
HELD_BACK = Histogram(
    "gateway_guard_held_back_tokens",
    "Generated tokens the guard withheld and never sent when a choice was cut",
    ["model"],
    buckets=(0, *TOKEN_BUCKETS),
)
GUARD_FAILURES = Counter("gateway_guard_failures_total", "Guard errors, by the failure policy applied", ["policy"])
GUARD_BUSY = Counter(
    "gateway_guard_busy_total",
    "No guard slot in time: prompts answered 503 guard_busy (gate=prompt), choices ended with content_filter "
    "before any text (gate=response)",
    ["gate"],
)
QUEUE_DEPTH = Gauge("gateway_queue_depth", "Requests waiting for a global admission slot", multiprocess_mode="livesum")
IN_FLIGHT = Gauge("gateway_in_flight_requests", "Admitted requests not yet finished", multiprocess_mode="livesum")
SHED = Counter("gateway_shed_total", "Requests refused by admission control", ["code", "reason"])
ADMISSION_SHARED = Gauge(
    "gateway_admission_shared",
    "1 while limits are shared through Redis, 0 while this process falls back to per-process limits",
    multiprocess_mode="livemin",
)
DRAINING = Gauge("gateway_draining", "1 after SIGTERM while in-flight streams finish", multiprocess_mode="livemax")

# Every label value the gateway can emit, at zero from the start: a panel over a rate of sheds, failures or
# aborts then shows 0 instead of "no data" until the first one happens, and an alert on it has a series.
for _code, _reason in (("429", "tenant_in_flight"), ("429", "tenant_rate"), ("503", "queue_full"),
                       ("503", "queue_timeout"), ("503", "draining")):
    SHED.labels(_code, _reason)
for _policy in ("fail_closed", "fail_open"):
    GUARD_FAILURES.labels(_policy)
for _gate in ("prompt", "response"):
    GUARD_BUSY.labels(_gate)
for _reason in ("guard_cut", "client_disconnect"):
    UPSTREAM_ABORTS.labels(_reason)
for _route in ("chat", "completions"):
    DISCONNECTS.labels(_route)
for _stage in ("first_token_timeout", "idle_timeout", "request_timeout"):
    ERRORS.labels(_stage)

_engine_running_source: Callable[[], float] | None = None

# Per-request collector: the ops layer (audit log) sets a list here for the request and reads the
# stats back when the response is done. None = nobody is collecting.
STATS_SINK: ContextVar[list[StreamStats] | None] = ContextVar("nextguard_stats_sink", default=None)


def set_engine_running_source(fn: Callable[[], float]) -> None:
    """Sample the engine's live request count at scrape time (exact even when the engine is idle)."""
    global _engine_running_source
    _engine_running_source = fn
    ENGINE_RUNNING.set_function(fn)


def record(stats: StreamStats) -> None:
    model = stats.model
    if stats.first_token_at is not None:
        TTFT.labels(model).observe(stats.first_token_at - stats.started)
    for gap in stats.itl:
        ITL.labels(model).observe(gap)
    PROMPT_TOKENS.labels(model).inc(stats.prompt_tokens)
    COMPLETION_TOKENS.labels(model).inc(stats.completion_tokens)
    for f in stats.finish_reasons:
        FINISH.labels(model, f).inc()
    for cut in stats.cuts:
        GUARD_DECISIONS.labels(cut.decision, cut.category, model).inc()
        CUT_POSITION.labels(model).observe(cut.token_offset)
        UPSTREAM_ABORTS.labels("guard_cut").inc()
        if cut.decision == "guard_error":
            GUARD_FAILURES.labels("fail_closed").inc()
        elif cut.decision == "guard_busy":
            GUARD_BUSY.labels(cut.gate).inc()
    for _ in stats.guard_fail_open:     # the guard failed, the policy let the text through unscored
        GUARD_FAILURES.labels("fail_open").inc()
    for n in stats.held_back:
        HELD_BACK.labels(model).observe(n)
    for dt in stats.guard_step:
        GUARD_STEP.labels(model).observe(dt)
    if stats.disconnected:
        DISCONNECTS.labels(stats.route).inc()
        UPSTREAM_ABORTS.labels("client_disconnect").inc()
    if stats.error:
        ERRORS.labels(stats.error).inc()
    sink = STATS_SINK.get()
    if sink is not None:
        sink.append(stats)


def render() -> tuple[bytes, str]:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        from prometheus_client import multiprocess

        if _engine_running_source is not None:
            # set_function gauges are invisible to the multiprocess collector: write the value to the file.
            ENGINE_RUNNING.set(_engine_running_source())
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
