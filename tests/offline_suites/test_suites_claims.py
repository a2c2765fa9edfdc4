"""Claims: verdicts and signed margins for every direction, and how they appear in a result."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from offline_suites.base import Check, RunContext, SuiteResult, claim
from offline_suites.registry import register_suite, unregister_suite


@pytest.mark.parametrize(("observed", "direction", "threshold", "verdict", "margin"), [
    (0.7, ">", 0.5, "reproduced", 0.2),
    (0.3, ">", 0.5, "not reproduced at this scale", -0.2),
    (0.5, ">", 0.5, "not reproduced at this scale", 0.0),
    (0.5, ">=", 0.5, "reproduced", 0.0),
    (0.2, "<", 0.5, "reproduced", 0.3),
    (0.9, "<", 0.5, "not reproduced at this scale", -0.4),
    (0.5, "<=", 0.5, "reproduced", 0.0),
])
def test_claim_verdict_and_margin(observed: float, direction: str, threshold: float, verdict: str,
                                  margin: float) -> None:
    c = claim("x", "statement", observed, direction, threshold)  # type: ignore[arg-type]
    assert c.verdict == verdict
    assert c.margin == pytest.approx(margin, abs=1e-12)


def test_claim_non_finite_is_never_reproduced() -> None:
    c = claim("x", "s", float("nan"), "<", 1.0)
    assert c.verdict == "not reproduced at this scale" and math.isnan(c.margin)
    assert c.to_dict()["margin"] is None          # strict JSON
    with pytest.raises(ValueError, match="direction must be one of"):
        claim("x", "s", 1.0, "==", 1.0)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Cfg:
    null_method: bool = False
    SMOKE: ClassVar[_Cfg]
    FULL: ClassVar[_Cfg]


_Cfg.SMOKE = _Cfg()
_Cfg.FULL = _Cfg()


def test_claims_in_result_summary_and_on_disk(tmp_path: Path) -> None:
    @register_suite("claims-demo", version=1, config=_Cfg, null_method="nothing")
    def run(ctx: RunContext, config: _Cfg, seed: int) -> SuiteResult:
        return ctx.result({}, {}, [Check("ok", "hard", True, True, 0, True)],
                          claims=[claim("up", "it rises", 2.0, ">", 1.0), claim("down", "it falls", 2.0, "<", 1.0)])

    try:
        from offline_suites.registry import get_suite

        result = get_suite("claims-demo").run(RunContext(results_dir=tmp_path), _Cfg.SMOKE, 0)
    finally:
        unregister_suite("claims-demo")
    body = result.to_dict()
    # a claim that is not reproduced does not fail the run
    assert result.hard_passed and body["summary"]["hard_passed"]
    assert body["summary"]["claims"] == {"up": {"verdict": "reproduced", "margin": 1.0},
                                         "down": {"verdict": "not reproduced at this scale", "margin": -1.0}}
    assert body["summary"]["claims_reproduced"] == 1 and body["summary"]["claims_total"] == 2
    assert "result.json" in body["artifacts"]
    assert json.loads((tmp_path / "result.json").read_text())["claims"] == body["claims"]
