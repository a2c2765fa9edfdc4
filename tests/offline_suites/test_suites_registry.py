from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import ClassVar

import pytest

from offline_suites.base import (
    NULL,
    ConfigError,
    Method,
    build_config,
    leave_untrained,
    numeric_fields,
    train_for,
)
from offline_suites.registry import (
    BUILTIN_MODULES,
    DuplicateSuiteError,
    UnknownSuiteError,
    get_suite,
    list_suites,
    register_suite,
)

FIVE = {"powerlaw-cot", "fp-equivariance", "repsim", "tableagent", "cgm"}
TIME_SERIES_SENSORS = {"kineflow", "dicot", "bicrossnet", "scale-cp"}
GRAPHS_LEARNING = {"parpic", "weight-perturb", "iterated-erm", "area-cil"}
IMAGES_RL = {"nextpixel-scaling", "asasr", "textatlas", "return-critic"}


def test_builtin_set_is_exact() -> None:
    names = {s.name for s in list_suites() if s.fn.__module__ in BUILTIN_MODULES}
    assert names == FIVE | TIME_SERIES_SENSORS | GRAPHS_LEARNING | IMAGES_RL


def test_duplicate_name_raises() -> None:
    suite = get_suite("cgm")
    with pytest.raises(DuplicateSuiteError, match="already registered"):
        register_suite("cgm", version=1, config=suite.config_cls)(lambda ctx, c, s: None)


@dataclasses.dataclass(frozen=True)
class _NoNull:
    steps: int = 1
    method: str = "fit"
    run_seeds: int = 1
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {"steps": (0, 5), "run_seeds": (1, 20)}
    METHODS: ClassVar[dict[str, Method]] = {"fit": Method("trained", train_for)}
    SMOKE: ClassVar[_NoNull]
    FULL: ClassVar[_NoNull]


_NoNull.SMOKE = _NoNull()
_NoNull.FULL = _NoNull(steps=2, run_seeds=3)


@dataclasses.dataclass(frozen=True)
class _NullByDefault:
    method: str = "fit"
    run_seeds: int = 1
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {"run_seeds": (1, 20)}
    METHODS: ClassVar[dict[str, Method]] = {"fit": Method("trained", train_for),
                                            "null": Method("untrained", leave_untrained)}
    SMOKE: ClassVar[_NullByDefault]
    FULL: ClassVar[_NullByDefault]


_NullByDefault.SMOKE = _NullByDefault(method="null")
_NullByDefault.FULL = _NullByDefault(method="null", run_seeds=3)


def test_null_method_is_required() -> None:
    # a suite without a null method cannot be mutation-tested, so it cannot register
    with pytest.raises(TypeError, match="METHODS must map method names to Method"):
        register_suite("no-null", version=1, config=_NoNull)
    # the presets run the suite's own method, never the null
    with pytest.raises(TypeError, match="needs a field `method: str` naming one of its METHODS other than 'null'"):
        register_suite("null-on", version=1, config=_NullByDefault)
    _NoNull.METHODS = {"fit": Method("trained", train_for), "null": Method(" ", leave_untrained)}
    try:
        with pytest.raises(TypeError, match="METHODS must map"):
            register_suite("no-text", version=1, config=_NoNull)
    finally:
        _NoNull.METHODS = {"fit": Method("trained", train_for)}
    assert not {"no-null", "null-on", "no-text"} & {s.name for s in list_suites()}


def test_no_paper_reads_a_null_flag() -> None:
    """The method is chosen by name through ``Config.METHODS``; a suite that branched on the name (or kept a
    null flag) would let its checks know which method they measure."""
    for mod in BUILTIN_MODULES:
        src = Path(importlib.import_module(mod).__file__ or "").read_text()
        assert "null_method" not in src, mod
        assert not re.search(r"\.method\s*(==|!=|\bin\b|\bis\b)", src), f"{mod} branches on the method's name"
        assert "method_impl(" in src, f"{mod} never looks its method up by name"


@dataclasses.dataclass(frozen=True)
class _OneSeedFull:
    method: str = "fit"
    run_seeds: int = 1
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {"run_seeds": (1, 20)}
    METHODS: ClassVar[dict[str, Method]] = _NullByDefault.METHODS
    SMOKE: ClassVar[_OneSeedFull]
    FULL: ClassVar[_OneSeedFull]


_OneSeedFull.SMOKE = _OneSeedFull()
_OneSeedFull.FULL = _OneSeedFull(run_seeds=2)


def test_full_preset_needs_three_seeds() -> None:
    # a FULL claim's verdict needs a CI over seeds, so a FULL preset with fewer than three cannot register
    with pytest.raises(TypeError, match=r"run_seeds: int` \(>= 1 in SMOKE, >= 3 in FULL\)"):
        register_suite("one-seed", version=1, config=_OneSeedFull)
    for s in list_suites():
        if s.fn.__module__ in BUILTIN_MODULES:
            assert s.config_cls.FULL.run_seeds >= 3 and s.config_cls.SMOKE.run_seeds >= 1, s.name


@dataclasses.dataclass(frozen=True)
class _Unbounded:
    steps: int = 1
    method: str = "fit"
    run_seeds: int = 1
    METHODS: ClassVar[dict[str, Method]] = _NullByDefault.METHODS
    SMOKE: ClassVar[_Unbounded]
    FULL: ClassVar[_Unbounded]


_Unbounded.SMOKE = _Unbounded()
_Unbounded.FULL = _Unbounded(steps=10, run_seeds=3)


def test_numeric_fields_must_be_bounded() -> None:
    with pytest.raises(TypeError, match="BOUNDS lacks .* steps"):
        register_suite("unbounded", version=1, config=_Unbounded)
    _Unbounded.BOUNDS = {"steps": (0, 5), "run_seeds": (1, 20)}  # type: ignore[attr-defined]
    try:
        # a preset outside its own bounds is a registration error, not a runtime surprise
        with pytest.raises(TypeError, match=r"FULL: config field 'steps' must be within \[0, 5\]"):
            register_suite("unbounded", version=1, config=_Unbounded)
    finally:
        del _Unbounded.BOUNDS  # type: ignore[attr-defined]


def test_overrides_outside_bounds_rejected() -> None:
    cls = get_suite("cgm").config_cls
    with pytest.raises(ConfigError, match=r"'epochs' must be within \[0, 100000\]"):
        build_config(cls, "smoke", {"epochs": 10**9})
    with pytest.raises(ConfigError, match="'lambdas' must be within"):
        build_config(cls, "smoke", {"lambdas": [1.0, -0.1]})
    with pytest.raises(ConfigError, match="'vocab' must be within"):
        build_config(cls, "smoke", {"vocab": 1000})
    with pytest.raises(ConfigError, match="'seq_len' must be within"):
        build_config(get_suite("fp-equivariance").config_cls, "smoke", {"seq_len": 2})
    assert build_config(cls, "smoke", {"epochs": 0}).epochs == 0
    for s in list_suites():
        if s.fn.__module__ in BUILTIN_MODULES:
            assert set(s.config_cls.BOUNDS) >= set(numeric_fields(s.config_cls)), s.name


def test_every_suite_registers_a_null_method() -> None:
    for s in list_suites():
        if s.fn.__module__ in BUILTIN_MODULES:
            own = s.config_cls.SMOKE.method
            assert own != NULL and {own, NULL} <= set(s.methods), s.name
            assert s.info()["methods"] == {k: m.description for k, m in s.methods.items()}, s.name
            assert build_config(s.config_cls, "smoke", {"method": NULL}).method == NULL
    with pytest.raises(ConfigError, match="Unknown method 'nul'. Did you mean: null"):
        build_config(get_suite("cgm").config_cls, "smoke", {"method": "nul"})


def test_unknown_name_suggests() -> None:
    with pytest.raises(UnknownSuiteError) as e:
        get_suite("fp-equivarance")
    assert "Did you mean: fp-equivariance?" in str(e.value)
    assert "Available:" in str(e.value) and "tableagent" in str(e.value)


def test_config_overrides_validated() -> None:
    cls = get_suite("cgm").config_cls
    cfg = build_config(cls, "smoke", {"lambdas": [1.0, 0.5], "epochs": 10})
    assert cfg.lambdas == (1.0, 0.5) and cfg.epochs == 10
    assert dataclasses.replace(cfg, epochs=cls.SMOKE.epochs, lambdas=cls.SMOKE.lambdas) == cls.SMOKE
    with pytest.raises(ConfigError, match="Did you mean: epochs"):
        build_config(cls, "smoke", {"epoch": 3})
    with pytest.raises(ConfigError, match="expects int"):
        build_config(cls, "smoke", {"epochs": "many"})
    with pytest.raises(ConfigError, match="Unknown preset"):
        build_config(cls, "medium")


def test_presets_declared_and_distinct() -> None:
    for s in list_suites():
        if s.fn.__module__ in BUILTIN_MODULES:
            p = s.presets()
            assert set(p) == {"smoke", "full"} and p["smoke"] != p["full"], s.name
