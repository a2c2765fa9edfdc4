"""Claims: the platform's verdict rule (CI over seeds against no-effect and the paper's number), and how
claims from several seeds merge into one result."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from offline_suites.base import Check, Method, RunContext, SuiteResult, claim, mean_ci95, verdict_for
from offline_suites.registry import get_suite, register_suite, unregister_suite


def test_mean_ci95_matches_the_t_interval() -> None:
    mean, ci = mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and ci is not None
    # sd 1, n 3, t(0.975, 2) = 4.303
    assert ci == pytest.approx((2.0 - 4.303 / math.sqrt(3), 2.0 + 4.303 / math.sqrt(3)))
    assert mean_ci95([5.0])[1] is None


@pytest.mark.parametrize(("per_seed", "direction", "paper", "no_effect", "fraction", "verdict"), [
    # tight effect, well past no effect and at the paper's number
    ([2.5, 2.6, 2.55], ">", 2.5, 1.0, 1.0, "reproduced"),
    # CI excludes no effect but the mean falls short of the paper's number, and the CI reaches it: undecided
    ([1.5, 2.6, 2.2], ">", 2.5, 1.0, 1.0, "inconclusive"),
    # ... unless half of the paper's effect is the stated target
    ([1.9, 2.1, 2.0], ">", 2.5, 1.0, 0.5, "reproduced"),
    # the CI lies wholly short of the paper's number
    ([1.0, 1.05, 1.02], ">", 2.5, 1.0, 1.0, "not reproduced"),
    # wide CI straddling no effect (the return-critic case): never reproduced
    ([-0.12, 1.05, 0.6], ">", 0.0, 0.0, 1.0, "inconclusive"),
    # lower-is-better claims mirror
    ([0.1, 0.12, 0.11], "<", 0.2, 1.0, 1.0, "reproduced"),
    ([0.5, 0.52, 0.51], "<", 0.2, 1.0, 1.0, "not reproduced"),
    # fewer than three seeds is inconclusive by rule, however clear
    ([9.0, 9.0], ">", 1.0, 0.0, 1.0, "inconclusive"),
    ([9.0], ">", 1.0, 0.0, 1.0, "inconclusive"),
    ([1.0, float("nan"), 1.0], ">", 0.5, 0.0, 1.0, "inconclusive"),
])
def test_verdict_rule(per_seed: list[float], direction: str, paper: float, no_effect: float, fraction: float,
                      verdict: str) -> None:
    got, reason, _, _ = verdict_for(per_seed, direction, paper, no_effect, fraction)  # type: ignore[arg-type]
    assert got == verdict, reason


def test_suite_reason_makes_a_claim_inconclusive() -> None:
    got, reason, _, _ = verdict_for([3.0, 3.1, 3.05], ">", 1.0, 0.0, inconclusive="optimum on the grid's edge")
    assert got == "inconclusive" and reason == "optimum on the grid's edge"


def test_claim_arguments_validated() -> None:
    with pytest.raises(ValueError, match="direction must be one of"):
        claim("x", "s", 1.0, "==", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fraction must be in"):
        claim("x", "s", 1.0, ">", 1.0, fraction=0.0)
    c = claim("x", "s", float("nan"), "<", 1.0)
    assert c.verdict == "inconclusive" and c.to_dict()["observed"] is None       # strict JSON


@dataclass(frozen=True)
class _Cfg:
    method: str = "demo"
    run_seeds: int = 1
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {"run_seeds": (1, 20)}
    METHODS: ClassVar[dict[str, Method]] = {"demo": Method("demo", None), "null": Method("nothing", None)}
    SMOKE: ClassVar[_Cfg]
    FULL: ClassVar[_Cfg]


_Cfg.SMOKE = _Cfg()
_Cfg.FULL = _Cfg(run_seeds=3)


def test_seeds_merge_into_one_verdict(tmp_path: Path) -> None:
    seen: list[int] = []

    @register_suite("claims-demo", version=1, config=_Cfg)
    def run(ctx: RunContext, config: _Cfg, seed: int) -> SuiteResult:
        seen.append(seed)
        ctx.save_json("out.json", {"seed": seed})
        ctx.progress(1.0, "done")
        effect = 2.0 + 0.01 * seed
        return ctx.result({"effect": effect}, {}, [Check("ok", "gate", True, True, 0, seed != 12),
                                                   Check("identity", "sanity", 0, 0, 0, True)],
                          claims=[claim("up", "it rises to 2", effect, ">", 2.0, no_effect=0.0),
                                  claim("far", "it rises to 5", effect, ">", 5.0, no_effect=0.0)])

    progress: list[float] = []
    try:
        suite = get_suite("claims-demo")
        one = suite.run(RunContext(results_dir=tmp_path / "one"), _Cfg.SMOKE, 0).to_dict()
        three = suite.run(RunContext(results_dir=tmp_path / "three", on_progress=lambda f, m: progress.append(f)),
                          _Cfg.FULL, 10)
    finally:
        unregister_suite("claims-demo")
    # one seed: every claim inconclusive, whatever the observation
    assert {c["verdict"] for c in one["claims"]} == {"inconclusive"} and one["summary"]["gates_passed"]
    assert seen == [0, 10, 11, 12]
    body = three.to_dict()
    verdicts = {c["name"]: c["verdict"] for c in body["claims"]}
    assert verdicts == {"up": "reproduced", "far": "not reproduced"}
    up = next(c for c in body["claims"] if c["name"] == "up")
    assert up["per_seed"] == pytest.approx([2.1, 2.11, 2.12]) and up["ci95"][0] > 0.0
    # a gate holds only if it held on every seed; sanity never counts as a gate
    assert not three.gates_passed and body["summary"]["gates_failed"] == ["ok"]
    assert body["summary"]["gates"] == 1 and body["summary"]["sanity"] == 1
    assert body["provenance"]["seeds"] == [10, 11, 12] and set(body["metrics"]["by_seed"]) == {"10", "11", "12"}
    assert body["summary"]["claims_reproduced"] == 1 and body["summary"]["claims_not_reproduced"] == 1
    # each seed keeps its artifacts; progress spans the seeds and ends at 1
    assert {"out.json", "seed-11/out.json", "seed-12/out.json", "result.json"} <= set(body["artifacts"])
    assert all((tmp_path / "three" / a).is_file() for a in body["artifacts"])
    assert progress == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert json.loads((tmp_path / "three" / "result.json").read_text())["claims"] == body["claims"]
