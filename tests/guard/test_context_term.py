"""The response gate's context term: offline and streamed scores agree, the artifact keeps it, and the
calibration split's weight choice holds the budget and picks the term only where it helps."""

from __future__ import annotations

import numpy as np
import pytest

from guard.bundle import GateSpec, MonitorSpec
from guard.monitor import ContextTerm, GateScorer, Head, Pooling, StreamScorer, score_sequence
from guard.recipe.response_context import ContextScores, fit_context_term, with_response_gate
from guard.recipe.sources import Sample
from guard.text import context_chars, response_context, response_text, user


def _scorer(weight: float, scale: float, pooling: Pooling = Pooling(4, 2)) -> GateScorer:
    ov = Head([4, 1], [1.0, 0.5], scales=[2.0, 1.0], bias=-0.2, clip=3.0)
    ctx = ContextTerm(Head([2, 4], [0.7, -0.3], bias=5.0), weight, scale)
    return GateScorer(ov, columns=[1, 2, 4], threshold=0.6, pooling=pooling, context=ctx)


@pytest.mark.parametrize("split_context", [False, True])
def test_stream_with_context_term_equals_offline(split_context):
    rng = np.random.default_rng(7)
    T, s, ctx = 48, 11, (2, 8)       # the answered conversation: rows 2..7 (labels around it are not read)
    acts = rng.exponential(0.6, size=(T, 3))
    norms = rng.uniform(1, 2, size=T)
    norms[0] = 400.0
    norms[5] = 300.0                 # an outlier inside the conversation: dropped from its mean too
    sc = _scorer(0.8, 0.6)
    off = score_sequence(sc, acts, norms, (s, T), context_span=ctx)
    plain = score_sequence(GateScorer(sc.overall, sc.columns, sc.threshold, sc.pooling), acts, norms, (s, T))
    rows = [2, 3, 4, 6, 7]
    p = float((acts[rows][:, [1, 2]] @ np.array([0.7, -0.3])).mean())    # the head's bias plays no part
    np.testing.assert_allclose(off.c, -0.2 + np.exp(0.6 * p) * (plain.c + 0.2) + 0.8 * p, rtol=1e-12)
    assert not np.allclose(off.c, plain.c)
    st = StreamScorer(sc)
    if split_context:                # a context read in two pieces gives the same term
        st.context(norms[:5], acts[:5], (2, 5))
        st.context(norms[5:s], acts[5:s], (0, 3))
    else:
        st.context(norms[:s], acts[:s], ctx)
    cs = [st.step(acts[t], norms[t])[0] for t in range(s, T)]
    np.testing.assert_allclose(cs, off.c, rtol=1e-12)
    # a gate with a term refuses to score without the conversation's span
    with pytest.raises(ValueError, match="activations"):
        StreamScorer(sc).context(norms[:s], acts[:s])
    with pytest.raises(ValueError, match="token span"):
        score_sequence(sc, acts, norms, (s, T))
    with pytest.raises(ValueError, match="before the scored span"):
        score_sequence(sc, acts, norms, (s, T), context_span=(2, s + 1))
    # a conversation cut away entirely (a long one keeps its end) leaves no term
    np.testing.assert_allclose(score_sequence(sc, acts, norms, (s, T), context_span=(T, T)).c, plain.c, rtol=1e-12)
    # the multiplier is bounded, whatever the context
    assert ContextTerm(Head([2], [1.0]), 0.0, 1.0).apply(1e6, 1)[1] == pytest.approx(np.exp(ContextTerm.MAX_EXP))


def test_context_term_needs_its_columns_and_a_streaming_gate():
    with pytest.raises(ValueError, match="lack selected"):
        GateScorer(Head([1], [1.0]), columns=[1], threshold=0.0, context=ContextTerm(Head([9], [1.0]), 1.0, 0.1))
    with pytest.raises(ValueError, match="context term"):
        GateScorer(Head([1], [1.0]), columns=[1], threshold=0.0, pooling=Pooling(8, 1, final=True),
                   context=ContextTerm(Head([1], [1.0]), 1.0, 0.1))


def test_gate_spec_round_trip_keeps_the_context_term():
    g = GateSpec(Head([4, 1], [1.0, 0.5]), Pooling(4, 2), 0.3, context=ContextTerm(Head([2], [0.7], bias=1.0), 0.4, 0.1))
    back = GateSpec.from_dict(g.to_dict())
    assert back.context == g.context
    assert back.all_ids() == [1, 2, 4]
    assert GateSpec.from_dict(GateSpec(Head([1], [1.0]), Pooling(), 0.0).to_dict()).context is None


class _Enc:
    ids = [1, 2, 4]


def _spec(response: GateSpec) -> MonitorSpec:
    prompt = GateSpec(Head([2], [1.0], bias=-1.0), Pooling(64, 1, final=True), 0.5)
    return MonitorSpec(_Enc(), {"prompt": prompt, "response": response}, "t")   # type: ignore[arg-type]


def _answers(rng, n, label, source, risk, answer):
    """n answers whose response peak is ``answer`` + noise and whose context mean is ``risk`` + noise."""
    ss = [Sample((("user", f"{source} {i}"),), "x", label, None, source, f"{source}{i}") for i in range(n)]
    sc = [ContextScores(np.array([answer + rng.normal(0, 0.3)]), 10 * (risk + rng.normal(0, 0.3)), 10) for _ in range(n)]
    return ss, sc


def test_weight_choice_holds_the_budget_and_helps_only_where_the_context_separates():
    rng = np.random.default_rng(0)
    resp = GateSpec(Head([4], [1.0]), Pooling(4, 2), 9.9, benign_scores=[0.0])
    parts = [_answers(rng, 300, 0, "generator/benign/everyday", 0.0, 0.0),    # benign requests' answers
             _answers(rng, 100, 0, "generator/refusal/source", 3.0, -1.5),    # refusals of harmful requests
             _answers(rng, 100, 1, "generator/compliance/source", 3.0, 0.2)]  # compliance: like a benign answer
    ss = [s for p in parts for s in p[0]]
    sc = [x for p in parts for x in p[1]]
    grid = [(0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.0, 0.5)]
    gate, rec = fit_context_term(_spec(resp), ss, sc, budget=0.02, grid=grid)
    assert gate.context is not None and (gate.context.weight, gate.context.scale) != (0.0, 0.0)
    assert rec["tried"][0]["weight"] == rec["tried"][0]["scale"] == 0.0
    assert rec["chosen"]["f1"] > rec["tried"][0]["f1"] + 0.3
    assert gate.context.head == _spec(resp).gates["prompt"].overall
    scorer = GateScorer(resp.overall, [1, 2, 4], gate.threshold, resp.pooling, context=gate.context)
    benign = np.array([scorer.with_context(x.c, *gate.context.apply(x.context_total, x.context_n)).max() for x in sc[:300]])
    assert np.mean(benign > gate.threshold) <= 0.02
    assert sorted(gate.benign_scores) == pytest.approx(sorted(benign))
    assert gate.calibration["without_context"]["threshold"] == 9.9
    # where the context says nothing (every request alike), no term is chosen and none is served
    flat = [ContextScores(x.c, 10 * rng.normal(0, 0.3), 10) for x in sc]
    gate0, _ = fit_context_term(_spec(resp), ss, flat, budget=0.02, grid=grid)
    assert gate0.context is None
    with pytest.raises(ValueError, match="encoder lacks"):
        with_response_gate(_spec(resp), GateSpec(Head([9], [1.0]), Pooling(4, 2), 0.0))


def test_the_context_span_is_the_conversation_without_its_labels():
    gt = response_text(user("  hello there "), "hi")
    assert gt.context is not None and gt.text[slice(*gt.context)] == "hello there"
    conv = (("system", "be brief"), ("user", "first"), ("assistant", "ok"), ("user", "last one"))
    a, b = context_chars(conv)
    assert response_context(conv)[a:b] == "first\nAssistant: ok\nUser: last one"
    assert response_text(conv, "x").context == (a, b)
    # the leading system messages are the deployment's, not the request: the term skips them, however many
    two = (("developer", "be kind"), ("system", " be brief "), ("user", "q"))
    a, b = context_chars(two)
    assert response_context(two)[a:b] == "q"
    # a conversation of system messages alone is read whole; a system message after the first request is read
    only = (("system", "be brief"),)
    assert response_context(only)[slice(*context_chars(only))] == "be brief"
    late = (("user", "q"), ("system", "now be brief"))
    assert response_context(late)[slice(*context_chars(late))] == "q\nSystem: now be brief"
