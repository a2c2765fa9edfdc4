"""Unit tests of the tableagent and cgm pieces that the SMOKE contract run cannot pin down: the tree
topology, the agent loop when a conversation outgrows the context, the user simulator's fallback,
the LLM judge's agreement measure, and the cgm LM arm's statistic and closed forms."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from offline_suites.base import Method
from offline_suites.llm import ChatReply, ContextTooLong
from offline_suites.papers.tableagent import (
    PARENTS,
    TOPOLOGIES,
    Config,
    _expected,
    generate_dialogue,
    judge_agreement,
    judge_items,
    llm_agent,
    llm_judge,
    rule_judge,
    score_traces,
    scripted,
    simulated_question,
)


def _dialogues(tmp_path: Path, n: int = 6) -> list[Any]:
    rng = np.random.default_rng(0)
    return [generate_dialogue(tmp_path / f"d{i}", rng, ("en", "zh")[i % 2], TOPOLOGIES[i % 3], (2021, 2022, 2023))
            for i in range(n)]


def test_every_topology_and_language_with_exact_scripted_scores(tmp_path: Path) -> None:
    dlgs = _dialogues(tmp_path)
    assert {(d.lang, d.topology) for d in dlgs} == {(lang, t) for lang in ("en", "zh") for t in TOPOLOGIES}
    tree = next(d for d in dlgs if d.topology == "tree")
    assert [t.parents for t in tree.turns] == PARENTS["tree"] == [[], [0], [0], [1]]
    assert "regional_costs.xlsx" in tree.tables          # the two-row header table stays in every folder
    for kind in ("oracle", "rounding_0.2", "shotgun", "crashy"):
        scores = score_traces([scripted(d, kind, 20.0) for d in dlgs])
        for key, exp in _expected(dlgs, kind).items():
            assert scores[key] == pytest.approx(exp, abs=1e-12), (kind, key)


class _ChatByLength:
    """A chat whose context holds ``limit`` characters: longer conversations raise ContextTooLong.
    It always asks for a tool first, then answers, so tool traffic accumulates."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls = 0

    def __call__(self, messages: list[dict[str, Any]]) -> ChatReply:
        self.calls += 1
        if sum(_size(m) for m in messages) > self.limit:
            raise ContextTooLong("too long")
        if messages[-1]["role"] == "tool":
            return ChatReply("Final Answer: 42", "stop", 10, 3)
        return ChatReply("", "tool_calls", 10, 8, [{"id": f"call_{self.calls}", "type": "function", "function": {
            "name": "preview_table", "arguments": '{"name": "product_catalog.csv"}'}}])


def _size(message: dict[str, Any]) -> int:
    """Characters a message puts in the context: its text and its calls' arguments."""
    calls = message.get("tool_calls") or []
    return len(message.get("content") or "") + sum(len(c["function"]["arguments"]) for c in calls)


def test_agent_trims_then_ends_a_dialogue_that_outgrows_the_context(tmp_path: Path) -> None:
    dlg = _dialogues(tmp_path, 1)[0]
    cfg = Config(llm_turns=4, llm_max_steps=3)
    roomy = llm_agent(dlg, _ChatByLength(100_000), cfg)
    assert roomy.meta["truncations"] == 0 and roomy.meta["ended"] is None and all(roomy.answers)
    # room for about one turn and a half: earlier turns are trimmed away, the run goes on
    one_turn = sum(_size(m) for m in roomy.meta["messages"][:5])
    trimmed = llm_agent(dlg, _ChatByLength(one_turn + 150), cfg)
    assert trimmed.meta["truncations"] >= 1 and trimmed.meta["ended"] is None and all(trimmed.answers)
    assert len(trimmed.answers) == 4
    # not even the system prompt and one question fit: the dialogue ends, every turn unanswered
    ended = llm_agent(dlg, _ChatByLength(10), cfg)
    assert ended.meta["ended"] == "context" and ended.answers == [None] * 4
    assert score_traces([ended])["ic_micro_strict"] == 0.0


def test_user_simulator_keeps_the_numbers_or_falls_back(tmp_path: Path) -> None:
    turn = next(d for d in _dialogues(tmp_path) if d.lang == "en").turns[0]
    year = next(w for w in turn.info_item.split() if w.rstrip("?").isdigit()).rstrip("?")

    def says(text: str) -> Any:
        return lambda messages: ChatReply(text, "stop", 1, 1)

    ok = f"Which area made the most profit back in {year}?"
    assert simulated_question(turn, None, "en", says(ok)) == (ok, True)
    assert simulated_question(turn, None, "en", says("Which area made the most profit?")) == (turn.info_item, False)
    assert simulated_question(turn, None, "en", says("")) == (turn.info_item, False)


def test_judge_agreement_and_balanced_items(tmp_path: Path) -> None:
    assert judge_agreement([True, False, True, False], [True, False, True, False])["kappa"] == 1.0
    assert judge_agreement([True, False, True, False], [False, True, False, True])["kappa"] == -1.0
    a = judge_agreement([True, True, False, False], [True, True, True, True])
    assert a["agreement"] == 0.5 and a["kappa"] == 0.0
    dlgs = _dialogues(tmp_path)
    traces = [scripted(d, k, 20.0) for d in dlgs for k in ("oracle", "rounding_0.2")]
    items, ref = judge_items(traces, rule_judge, np.random.default_rng(0), 20)
    assert len(items) == 20 and sum(ref) == 10

    class Yes:
        def continuation_logprobs(self, prompt: str, conts: list[str]) -> list[float]:
            assert prompt.endswith("Reply:") and conts == [" yes", " no"]
            return [-1.0, -2.0]

    verdicts = llm_judge(Yes(), items)
    assert verdicts == [True] * 20 and judge_agreement(ref, verdicts)["kappa"] == 0.0


def test_cgm_lm_statistic_and_bernoulli_optimum() -> None:
    import gender_guesser.detector as gd

    from offline_suites.papers.cgm import _bern_kl, story_is_female

    det = gd.Detector(case_sensitive=False)
    assert story_is_female(" Dr. Maria Rodriguez", det) and story_is_female(" Emma Taylor", det)
    assert not story_is_female(" Dr. John Smith", det) and not story_is_female(" who lived", det)
    assert not story_is_female(" Dr. galaxy who", det)
    assert _bern_kl(0.4, 0.4) == 0.0
    assert _bern_kl(0.8, 0.5) == pytest.approx(0.8 * math.log(1.6) + 0.2 * math.log(0.4))
    assert _bern_kl(0.5, 0.0) == math.inf


# ------------------------------------------------------------------------------ platform: which door
def test_provenance_records_the_door_to_the_model(tmp_path: Path) -> None:
    """A run from the jobs API reaches the gateway as its submitter; provenance says so (and which
    weights a suite loaded for internals). Compose's worker uses the gateway for every run, so no
    worker process loads a second engine."""
    import yaml

    from offline_suites.base import Check, RunContext
    from offline_suites.config import SuiteSettings
    from offline_suites.jobs import _llm_factory
    from offline_suites.registry import register_suite, unregister_suite

    settings = SuiteSettings(api_base_url="http://gateway:8000/v1", api_key="ops", api_model="m")
    owned = _llm_factory({"llm_factory": None}, settings, "acme")()
    assert owned.describe() == {"door": "api", "client": "OpenAILLMClient", "base_url": "http://gateway:8000/v1",
                                "tenant": "acme", "model_id": "m", "guarded": True}

    @register_suite("door-demo", version=1, config=_DoorCfg)
    def run(ctx: RunContext, config: _DoorCfg, seed: int) -> Any:
        assert ctx.llm.model_id == "m"
        ctx.model_path()
        return ctx.result({}, {}, [Check("ok", "gate", True, True, 0, True)], uses_llm=True)

    try:
        from offline_suites.registry import get_suite

        ctx = RunContext(results_dir=tmp_path, llm_factory=lambda: owned, model_path_factory=lambda: tmp_path / "w")
        prov = get_suite("door-demo").run(ctx, _DoorCfg.SMOKE, 0).to_dict()["provenance"]
    finally:
        unregister_suite("door-demo")
    assert prov["llm"]["door"] == "api" and prov["llm"]["tenant"] == "acme" and prov["model_id"] == "m"
    assert prov["model_weights"] == str(tmp_path / "w")
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
    assert compose["services"]["worker"]["environment"]["NEXTGUARD_SUITES__LLM_BACKEND"] == "api"


@dataclasses.dataclass(frozen=True)
class _DoorCfg:
    method: str = "demo"
    run_seeds: int = 1
    METHODS: ClassVar[dict[str, Any]] = {"demo": Method("demo", None), "null": Method("nothing", None)}
    SMOKE: ClassVar[_DoorCfg]
    FULL: ClassVar[_DoorCfg]
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {"run_seeds": (1, 10)}


_DoorCfg.SMOKE = _DoorCfg()
_DoorCfg.FULL = _DoorCfg(run_seeds=3)
