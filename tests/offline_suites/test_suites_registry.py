from __future__ import annotations

import dataclasses

import pytest

from offline_suites.base import ConfigError, build_config
from offline_suites.registry import (
    BUILTIN_MODULES,
    DuplicateSuiteError,
    UnknownSuiteError,
    get_suite,
    list_suites,
    register_suite,
)

FIVE = {"powerlaw-cot", "fp-equivariance", "repsim", "tableagent", "cgm"}


def test_builtin_set_is_exact() -> None:
    names = {s.name for s in list_suites() if s.fn.__module__ in BUILTIN_MODULES}
    assert names == FIVE


def test_duplicate_name_raises() -> None:
    suite = get_suite("cgm")
    with pytest.raises(DuplicateSuiteError, match="already registered"):
        register_suite("cgm", version=1, config=suite.config_cls)(lambda ctx, c, s: None)


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
