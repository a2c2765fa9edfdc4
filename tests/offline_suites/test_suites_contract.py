"""One contract test for every registered suite's SMOKE preset (lm-eval's BaseTasks idea): schema,
the three kinds (sanity checks, gates, claims) present and well-formed, every gate passing, verdicts
the platform's rule gives, same seed → same result, time budget, provenance — and the mutation case:
the same preset with the suite's null method must fail a gate. LLM-facing parts run against the real
engine (session fixture ``suite_llm``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from offline_suites.base import NULL, RunContext, build_config, verdict_for
from offline_suites.registry import BUILTIN_MODULES, get_suite, list_suites

SMOKE_BUDGET_S = 60.0
NAMES = [s.name for s in list_suites() if s.fn.__module__ in BUILTIN_MODULES]


VERDICTS = {"reproduced", "not reproduced", "inconclusive"}


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
    # checks: sanity and gates, well-formed; at least one gate, every gate passing
    kinds = {c["kind"] for c in a["checks"]}
    assert "gate" in kinds and kinds <= {"gate", "sanity"}, f"{name}: needs gates, has {kinds}"
    for c in a["checks"]:
        assert set(c) >= {"name", "kind", "expected", "observed", "tolerance", "passed"}
        assert isinstance(c["passed"], bool) and c["tolerance"] is not None
    # claims: the paper's findings, each with its number and the verdict the platform's rule gives
    assert a["claims"], f"{name}: states none of its paper's claims"
    for c in a["claims"]:
        assert set(c) >= {"name", "statement", "direction", "threshold", "no_effect", "fraction", "target",
                          "observed", "per_seed", "ci95", "verdict", "reason"}
        assert c["verdict"] in VERDICTS and c["direction"] in (">", ">=", "<", "<=") and c["statement"]
        per_seed = [math.nan if v is None else v for v in c["per_seed"]]
        assert len(per_seed) == len(a["provenance"]["seeds"])
        assert verdict_for(per_seed, c["direction"], c["threshold"], c["no_effect"], c["fraction"],
                           c["inconclusive"])[0] == c["verdict"], c
    # SMOKE runs one seed: no claim can be decided from it
    assert {c["verdict"] for c in a["claims"]} == {"inconclusive"}
    claim_names = [c["name"] for c in a["claims"]]
    assert len(claim_names) == len(set(claim_names)), "claim names must be unique"
    assert a["summary"]["claims_total"] == len(a["claims"])
    assert {k: v["verdict"] for k, v in a["summary"]["claims"].items()} == {c["name"]: c["verdict"] for c in a["claims"]}
    failed = [c for c in a["checks"] if c["kind"] == "gate" and not c["passed"]]
    assert not failed, f"{name}: gates failed: {failed}"
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
    """SMOKE with the suite's method replaced by the one registered as "null", selected by name like any
    method: if every gate still passes, the gates do not look at what the method produced. Sanity checks
    do not count."""
    body = _run(name, suite_llm, tmp_path, overrides={"method": NULL})
    assert body["provenance"]["config"]["method"] == NULL
    gates = [c for c in body["checks"] if c["kind"] == "gate"]
    assert gates and not body["summary"]["gates_passed"], (
        f"{name}: every gate passed with the null method ({get_suite(name).methods[NULL].description}): "
        f"{[c['name'] for c in gates]}")
    assert body["provenance"]["wall_s"] <= SMOKE_BUDGET_S, f"{name}: null SMOKE took {body['provenance']['wall_s']} s"
