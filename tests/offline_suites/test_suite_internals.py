"""Unit tests of suite internals that the SMOKE contract run does not pin on its own: the
decomposition arm's exact error bounds, its config validation, and batched scoring."""

from __future__ import annotations

import dataclasses

import pytest

from offline_suites.base import ConfigError
from offline_suites.llm import BackgroundEngine
from offline_suites.papers.powerlaw_cot import Config, _tree_error, tree_depth


def test_tree_depth_needs_a_root_of_the_leaf_count() -> None:
    assert [tree_depth(64, k) for k in (2, 4, 8, 64)] == [6, 3, 2, 1]
    with pytest.raises(ConfigError, match="not a root"):
        tree_depth(64, 3)


@pytest.mark.parametrize("method", ["trained", "null"])
def test_tree_chain_error_between_first_step_and_step_sum(method: str) -> None:
    """The chain fails iff some step fails after a correct prefix: ε₁ ≤ chain ≤ Σ εₜ exactly, for a
    trained model and for an untrained one."""
    cfg = dataclasses.replace(Config.SMOKE, tree_steps=20, test_samples=500, hidden=16, method=method)
    r = _tree_error(3, 4, 3, cfg, seed=1)
    assert r["depth"] == 3 and len(r["step_errors"]) == 3
    assert r["step_errors"][0] <= r["error"] <= r["step_error_sum"] + 1e-12
    if method == "null":   # an untrained net guesses: far above the trained gate
        assert r["error"] > 0.5


def test_score_many_equals_one_prompt_at_a_time() -> None:
    from tests.offline_suites.doubles import HashEngine

    bg = BackgroundEngine(HashEngine)
    try:
        llm = bg.client()
        pairs = [("The capital of France is", " Paris"), ("Two plus two is", " four"), ("Hi", " there")]
        assert llm.score_many(pairs) == [llm.continuation_logprobs(p, [c])[0] for p, c in pairs]
    finally:
        bg.close()


def test_weight_perturb_reports_an_unclipped_guard_read_out_as_unbounded(tmp_path, monkeypatch) -> None:
    """A read-out over unclipped activations has no feature box: the suite says so (nothing certified)
    instead of failing, and a clipped read-out beside it is still bounded and checked."""
    import json
    from types import SimpleNamespace

    import numpy as np

    from offline_suites.papers import weight_perturb as wp

    def gate(clip):
        return {"overall": {"ids": [1, 2, 3], "weights": [0.7, -1.3, 0.21], "clip": clip}, "threshold": 0.5,
                "benign_scores": [-2.0, -1.0, 0.0, 0.4]}

    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps({"prompt": gate(None), "response": gate(4.0)}))
    monkeypatch.setattr(wp, "HEADS", heads)
    recorded = {}
    ctx = SimpleNamespace(record_data=lambda k, v: recorded.setdefault(k, v))
    checks, out = wp._guard(ctx, wp.Config.SMOKE, np.random.default_rng(0))
    assert recorded["guard_heads_json"] == heads.read_bytes()
    p, r = out["prompt"], out["response"]
    assert not p["bounded"] and p["clip"] is None
    assert p["int4"]["certified_share_box"] == 0.0 and p["int4"]["max_score_shift_box"] is None
    assert r["bounded"] and r["int8"]["max_score_shift_box"] > 0 and 0.0 < r["int8"]["certified_share_box"] <= 1.0
    assert [c.name for c in checks] == ["guard_box_bound_never_exceeded"] and all(c.passed for c in checks)
    json.dumps(out, allow_nan=False)
