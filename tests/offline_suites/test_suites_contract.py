"""One contract test for every registered suite's SMOKE preset (lm-eval's BaseTasks idea): schema,
checks and claims present and well-formed, every hard check passing, same seed → same result, time
budget, provenance — and the mutation case: the same preset with the suite's null method must fail
a hard check. LLM-facing parts run against the real engine (session fixture ``suite_llm``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from offline_suites.base import RunContext, build_config
from offline_suites.registry import BUILTIN_MODULES, get_suite, list_suites

SMOKE_BUDGET_S = 60.0
NAMES = [s.name for s in list_suites() if s.fn.__module__ in BUILTIN_MODULES]


VERDICTS = {"reproduced", "not reproduced at this scale"}


def _run(name: str, llm: Any, out: Path, seed: int = 0, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    suite = get_suite(name)
    progress: list[float] = []
    ctx = RunContext(results_dir=out, llm_factory=lambda: llm, on_progress=lambda f, m: progress.append(f))
    body = suite.run(ctx, build_config(suite.config_cls, "smoke", overrides), seed).to_dict()
    body["_progress"] = progress
    return body


def _comparable(body: dict[str, Any]) -> str:
    prov = {k: v for k, v in body["provenance"].items() if k not in ("wall_s", "finished_at")}
    return json.dumps({**{k: v for k, v in body.items() if k not in ("provenance", "_progress")}, "provenance": prov},
                      sort_keys=True)


@pytest.mark.parametrize("name", NAMES)
def test_smoke_contract(name: str, suite_llm: Any, tmp_path: Path) -> None:
    a = _run(name, suite_llm, tmp_path / "a")
    b = _run(name, suite_llm, tmp_path / "b")

    # schema
    assert set(a) >= {"suite", "version", "metrics", "reference_values", "checks", "claims", "artifacts",
                      "provenance", "summary"}
    assert a["suite"] == name and a["version"] == get_suite(name).version
    json.dumps(a, allow_nan=False)                 # strict JSON: no NaN/inf leaks
    # checks: present, well-formed, hard ones gating and all passing
    kinds = {c["kind"] for c in a["checks"]}
    assert "hard" in kinds and kinds <= {"hard", "soft"}, f"{name}: needs hard checks, has {kinds}"
    for c in a["checks"]:
        assert set(c) >= {"name", "kind", "expected", "observed", "tolerance", "passed"}
        assert isinstance(c["passed"], bool) and c["tolerance"] is not None
    # claims: the paper's findings, each with direction, margin and a verdict consistent with both
    assert a["claims"], f"{name}: states none of its paper's claims"
    for c in a["claims"]:
        assert set(c) >= {"name", "statement", "direction", "threshold", "observed", "margin", "verdict"}
        assert c["verdict"] in VERDICTS and c["direction"] in (">", ">=", "<", "<=") and c["statement"]
        if c["verdict"] == "reproduced":
            assert c["margin"] is not None and (c["margin"] > 0 or (c["margin"] == 0 and "=" in c["direction"])), c
        else:
            assert c["margin"] is None or c["margin"] < 0 or (c["margin"] == 0 and "=" not in c["direction"]), c
    claim_names = [c["name"] for c in a["claims"]]
    assert len(claim_names) == len(set(claim_names)), "claim names must be unique"
    assert a["summary"]["claims_total"] == len(a["claims"])
    assert a["summary"]["claims"] == {c["name"]: {"verdict": c["verdict"], "margin": c["margin"]} for c in a["claims"]}
    failed = [c for c in a["checks"] if c["kind"] == "hard" and not c["passed"]]
    assert not failed, f"{name}: hard checks failed: {failed}"
    names = [c["name"] for c in a["checks"]]
    assert len(names) == len(set(names)), "check names must be unique"
    # provenance
    prov = a["provenance"]
    assert prov["suite_version"] == a["version"] and prov["seed"] == 0
    assert prov["config"] == get_suite(name).presets()["smoke"]
    assert "numpy" in prov["packages"] and prov["data_hashes"], f"{name}: provenance lacks packages/data hashes"
    # artifacts exist where the context put them, the result itself among them
    assert a["artifacts"] and all((tmp_path / "a" / f).is_file() for f in a["artifacts"])
    on_disk = json.loads((tmp_path / "a" / "result.json").read_text())
    assert on_disk["checks"] == a["checks"] and on_disk["claims"] == a["claims"]
    # progress is monotone and ends at 1
    assert a["_progress"] and a["_progress"][-1] == 1.0
    assert all(x <= y for x, y in zip(a["_progress"], a["_progress"][1:], strict=False))
    # determinism and time budget
    assert _comparable(a) == _comparable(b), f"{name}: same seed gave a different result"
    for body in (a, b):
        assert body["provenance"]["wall_s"] <= SMOKE_BUDGET_S, f"{name}: SMOKE took {body['provenance']['wall_s']} s"
    assert math.isfinite(a["provenance"]["wall_s"])


@pytest.mark.parametrize("name", NAMES)
def test_null_method_fails_a_gate(name: str, suite_llm: Any, tmp_path: Path) -> None:
    """SMOKE with the suite's method replaced by its null variant: if every hard check still passes,
    the checks do not look at what the method produced."""
    body = _run(name, suite_llm, tmp_path, overrides={"null_method": True})
    assert body["provenance"]["config"]["null_method"] is True
    hard = [c for c in body["checks"] if c["kind"] == "hard"]
    assert hard and not body["summary"]["hard_passed"], (
        f"{name}: every hard check passed with the null method ({get_suite(name).null_method}): "
        f"{[c['name'] for c in hard]}")
    assert body["provenance"]["wall_s"] <= SMOKE_BUDGET_S, f"{name}: null SMOKE took {body['provenance']['wall_s']} s"
