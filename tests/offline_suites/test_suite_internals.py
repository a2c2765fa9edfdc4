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
