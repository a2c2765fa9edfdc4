"""Suite registry: ``@register_suite(name, version)`` and lookup with loud failures.

Usage::

    from offline_suites.registry import register_suite, get_suite, list_suites

    Config.METHODS = {"mlp": Method("an MLP trained with Adam", train),
                      "null": Method("the MLP is left untrained", leave_untrained)}

    @register_suite("my-suite", version=1, config=Config)
    def run(ctx, config, seed):
        fit = method_impl(config)     # the method config.method names
        ...

    get_suite("my-suite").run_preset("smoke", seed=0)

Built-in suites register by an explicit import list (:data:`BUILTIN_MODULES`) that is imported
on first lookup, so importing this module stays cheap (no torch) and a test can assert the exact
built-in set. Duplicate names raise; unknown names answer "Did you mean …? Available: …".

Every suite registers its methods by name in ``Config.METHODS`` (:class:`~offline_suites.base.Method`:
a sentence and the implementation), and a ``method: str`` config field picks one (the suite's own
method in both presets). One of them is ``"null"``: a method that should not work (untrained,
identity, random, or the baseline itself). The contract test runs SMOKE with ``method="null"`` and
expects a gate to fail; a suite whose gates pass whatever its method does measures nothing.

Every suite also declares ``run_seeds: int`` (1 in SMOKE, at least :data:`~offline_suites.base.MIN_SEEDS`
in FULL): the platform runs it once per seed and gives each claim a verdict from all of them.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offline_suites.base import Suite

# The built-in suites, grouped by field; `nextguard suites list` shows them in this order.
BUILTIN_MODULES: tuple[str, ...] = (
    "offline_suites.papers.powerlaw_cot",
    "offline_suites.papers.fp_equivariance",
    "offline_suites.papers.repsim",
    "offline_suites.papers.tableagent",
    "offline_suites.papers.cgm",
    # time series and sensors
    "offline_suites.papers.kineflow",
    "offline_suites.papers.scale_cp",
    "offline_suites.papers.dicot",
    "offline_suites.papers.bicrossnet",
    # graphs, perturbations, learning theory, continual learning
    "offline_suites.papers.iterated_erm",
    "offline_suites.papers.parpic",
    "offline_suites.papers.weight_perturb",
    "offline_suites.papers.area_cil",
    # images, OCR and pixel-based RL
    "offline_suites.papers.asasr",
    "offline_suites.papers.textatlas",
    "offline_suites.papers.return_critic",
    "offline_suites.papers.nextpixel_scaling",
)

_lock = threading.RLock()
_suites: dict[str, Suite] = {}
_builtins_loaded = False


class UnknownSuiteError(KeyError):
    """Lookup of a suite name that is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DuplicateSuiteError(ValueError):
    """A second registration under an existing name."""


def register_suite(
    name: str, version: int, *, config: type, description: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``run(ctx, config, seed) -> SuiteResult`` under ``name`` (decorator)."""
    import dataclasses

    from offline_suites.base import MIN_SEEDS, NULL, ConfigError, Method, Suite, check_bounds, numeric_fields

    if not isinstance(version, int) or version < 1:
        raise ValueError(f"suite {name!r}: version must be a positive int, got {version!r}")
    for preset in ("SMOKE", "FULL"):
        if not isinstance(getattr(config, preset, None), config):
            raise TypeError(f"suite {name!r}: {config.__name__}.{preset} must be a {config.__name__} instance")
    fields = {f.name: f for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else {}
    presets: Any = config               # SMOKE and FULL are class attributes, checked above to be instances
    methods = getattr(config, "METHODS", None)
    if (not isinstance(methods, dict) or NULL not in methods or len(methods) < 2
            or not all(isinstance(m, Method) and m.description.strip() for m in methods.values())):
        raise TypeError(f"suite {name!r}: {config.__name__}.METHODS must map method names to Method(description, "
                        f"impl), the suite's own method and {NULL!r} among them: a suite without a null method "
                        "cannot be mutation-tested")
    if ("method" not in fields or presets.SMOKE.method != presets.FULL.method
            or presets.SMOKE.method not in methods or presets.SMOKE.method == NULL):
        raise TypeError(f"suite {name!r}: {config.__name__} needs a field `method: str` naming one of its METHODS "
                        f"other than {NULL!r}, the same in SMOKE and FULL")
    full, smoke = presets.FULL, presets.SMOKE
    if "run_seeds" not in fields or full.run_seeds < MIN_SEEDS or smoke.run_seeds < 1:
        raise TypeError(f"suite {name!r}: {config.__name__} needs a field `run_seeds: int` (>= 1 in SMOKE, "
                        f">= {MIN_SEEDS} in FULL): a claim's verdict needs a CI over several seeds")
    unbounded = sorted(set(numeric_fields(config)) - set(getattr(config, "BOUNDS", {})))
    if unbounded:
        raise TypeError(f"suite {name!r}: {config.__name__}.BOUNDS lacks (lo, hi) for numeric fields "
                        f"{', '.join(unbounded)}")
    for preset in ("SMOKE", "FULL"):
        for key in numeric_fields(config):
            try:
                check_bounds(config, key, getattr(getattr(config, preset), key))
            except ConfigError as exc:
                raise TypeError(f"suite {name!r}: {config.__name__}.{preset}: {exc}") from None

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        doc = description or (fn.__module__ and (importlib.import_module(fn.__module__).__doc__ or ""))
        text = (doc or "").strip().split("\n\n")[0].replace("\n", " ")
        if text.startswith(f"{name}:"):
            text = text[len(name) + 1:].strip()
        suite = Suite(name=name, version=version, config_cls=config, fn=fn, description=text)
        with _lock:
            if name in _suites:
                raise DuplicateSuiteError(
                    f"suite {name!r} is already registered (by {_suites[name].fn.__module__}); "
                    "pick another name or bump the version of the existing one")
            _suites[name] = suite
        return fn

    return deco


def unregister_suite(name: str) -> None:
    """Remove a suite (tests register throw-away suites and clean them up)."""
    with _lock:
        _suites.pop(name, None)


def load_builtins() -> None:
    global _builtins_loaded
    with _lock:
        if _builtins_loaded:
            return
        for mod in BUILTIN_MODULES:
            importlib.import_module(mod)
        _builtins_loaded = True


def get_suite(name: str) -> Suite:
    load_builtins()
    with _lock:
        if name in _suites:
            return _suites[name]
        available = sorted(_suites)
    msg = f"Unknown suite {name!r}."
    close = difflib.get_close_matches(name, available, n=3, cutoff=0.5)
    if close:
        msg += f" Did you mean: {', '.join(close)}?"
    msg += f" Available: {', '.join(available)}"
    raise UnknownSuiteError(msg)


def list_suites() -> list[Suite]:
    load_builtins()
    with _lock:
        return [_suites[k] for k in sorted(_suites)]
