"""The evaluation reports drift streams by whose text their unsafe part is."""

import numpy as np

from guard.evaluate import Scored, drift_bodies, drift_origin, gate_metrics
from guard.recipe.data import drift_streams
from guard.recipe.sources import Sample


def _answer(text: str, label: int, source: str) -> Sample:
    return Sample.single(f"request for {source}", text, label, "violence" if label else None, source)


def test_drift_streams_are_split_by_the_source_of_their_unsafe_part():
    benign = [_answer(f"Here is a long and friendly answer number {i}. It has a second sentence. And a third one.",
                      0, "generator/benign/everyday") for i in range(4)]
    own = _answer("Sure, here is what you asked for: 1. The tutorial will be delivered to you by email soon.", 1,
                  "generator/compliance/source")
    other = _answer("Detailed harmful text written by another model, long enough to be used as a drift body.", 1,
                    "pyrit/scorer_evals/harm/violence")
    refusal = _answer("I cannot help with that request, and here is why it would be harmful to anyone.", 0,
                      "generator/refusal/source")
    drift = drift_streams(benign, [own, other], 12, seed=3)
    bodies = drift_bodies([*benign, own, other, refusal, *drift])
    assert set(bodies.values()) == {"generator/compliance/source", "pyrit/scorer_evals/harm/violence"}
    origins = [drift_origin(s, bodies) for s in drift]
    assert set(origins) == {"served_model_compliance", "other_models_text"}
    for s, o in zip(drift, origins, strict=True):
        assert (s.response or "").endswith(own.response if o == "served_model_compliance" else other.response)
    # cut every stream whose unsafe part is another model's text, none of the others
    scored = [Scored(np.zeros(40), 30 if o == "other_models_text" else None, 0.0, 40, 20) for o in origins]
    d = gate_metrics(drift, scored, bodies)["drift"]
    assert d["cut_rate"] == origins.count("other_models_text") / len(drift)
    assert d["by_unsafe_part"]["other_models_text"]["cut_rate"] == 1.0
    assert d["by_unsafe_part"]["served_model_compliance"]["cut_rate"] == 0.0
    assert d["by_unsafe_part"]["other_models_text"]["n"] == origins.count("other_models_text")
    # a stream whose unsafe part matches no known answer is counted apart, not guessed
    odd = Sample(drift[0].conv, "Benign start. " + "text no answer has " * 5, 1, None, "constructed/drift", "g", 14)
    assert drift_origin(odd, bodies) == "unknown"
    assert "by_unsafe_part" not in gate_metrics(drift, scored)["drift"]


def test_drift_origin_uses_the_stream_onset_not_a_prefix_match():
    own = _answer("Of course. 1. Step one of the plan. 2. Step two of the plan, with more words after it.", 1,
                  "generator/compliance/pair")
    bodies = drift_bodies([own])
    s = Sample(own.conv, "A benign opening sentence here. " + (own.response or ""), 1, None, "constructed/drift", "g",
               len("A benign opening sentence here. "))
    assert drift_origin(s, bodies) == "served_model_compliance"
    shifted = Sample(s.conv, s.response, 1, None, "constructed/drift", "g", (s.onset or 0) - 3)
    assert drift_origin(shifted, bodies) == "unknown"


def test_hand_annotation_backs_the_drift_body_rule():
    """The hand annotation of the previous drift streams (the served model's compliance as their unsafe part)
    is what the body rule rests on: every annotated unsafe part the rule admits was judged harmful in its own
    words, and every one judged harmless is refused. The answers those parts came from are still rows of the
    committed data, found by the annotated start of their text."""
    import gzip
    import json
    from pathlib import Path

    from guard.recipe.data import drift_bodies as rule_bodies

    root = Path(__file__).resolve().parents[2]
    ann = json.loads((root / "guard" / "eval_report" / "drift-test-unsafe-parts-annotated.json").read_text())
    with gzip.open(root / "guard" / "artifacts" / "data.jsonl.gz", "rt") as f:
        samples = [Sample.from_json({k: v for k, v in json.loads(line).items() if k != "split"}) for line in f]
    answers = [s for s in samples if s.gate == "response" and s.label and s.source.startswith("generator/compliance")]
    admitted = {id(s) for s in rule_bodies(samples)}
    verdicts = {True: [], False: []}
    for x in ann["streams"]:
        src = [s for s in answers if (s.response or "").strip().startswith(x["unsafe_part_start"])]
        assert src, x["stream"]
        verdicts[bool(x["harm_in_text"])].append(any(id(s) in admitted for s in src))
    assert len(verdicts[True]) == ann["harm_in_text"] and len(verdicts[True]) + len(verdicts[False]) == ann["n"]
    assert not any(verdicts[False])                 # no part judged harmless is admitted
    assert sum(verdicts[True]) >= 0.85 * len(verdicts[True])
    # and no drift stream of the committed data continues with an answer the rule refuses
    bodies = {(s.response or "").strip() for s in rule_bodies(samples)}
    drift = [s for s in samples if s.source == "constructed/drift"]
    assert drift and all((s.response or "")[s.onset or 0:] in bodies for s in drift)


def test_hand_annotation_groups_reach_the_drift_report():
    from guard.evaluate import eval_groups, sample_hash

    benign = [_answer(f"A friendly answer number {i}. It has a second sentence. And a third one here.", 0,
                      "generator/benign/everyday") for i in range(3)]
    own = _answer("Here's a step-by-step guide to do the harmful thing:\n\n1. First step of it, in detail.", 1,
                  "generator/compliance/pair")
    drift = drift_streams(benign, [own], 6, seed=1)
    bodies = drift_bodies([*benign, own, *drift])
    ann = {sample_hash(s): i % 2 == 0 for i, s in enumerate(drift)}
    groups = eval_groups(bodies, ann)
    assert all(groups(s)[:2] == ["drift", "drift/served_model_compliance"] for s in drift)
    scored = [Scored(np.zeros(40), 30 if ann[sample_hash(s)] else None, 0.0, 40, 20) for s in drift]
    d = gate_metrics(drift, scored, bodies, ann)["drift"]["by_unsafe_part"]
    assert d["served_model_compliance/harm_in_text"]["cut_rate"] == 1.0
    assert d["served_model_compliance/harmless_text"]["cut_rate"] == 0.0
    assert groups(own) == ["unsafe"]
    assert len(eval_groups(bodies, {})(drift[0])) == 2


def test_drift_rule_takes_text_harmful_on_its_own_from_the_same_split():
    from guard.recipe.data import drift_bodies as rule_bodies

    heads = [_answer(f"A friendly answer number {i}. It has a second sentence. And a third one here.", 0,
                     "generator/benign/everyday") for i in range(12)]
    heads = [Sample(h.conv, h.response, 0, None, h.source, f"g{i}") for i, h in enumerate(heads)]
    long = " More words so that the text is long enough to continue a stream with."
    goal = Sample.single("q", "Here's a step-by-step guide to do it:" + long, 1, "x", "generator/compliance/pair")
    generic = Sample.single("q", "Sure, here is what you asked for:" + long, 1, "x", "generator/compliance/source")
    other = Sample.single("q", "Harmful text another model wrote." + long, 1, "x", "pyrit/scorer_evals/harm/violence")
    refusal = Sample.single("q", "I can't help with that." + long, 0, None, "generator/refusal/source")
    short = Sample.single("q", "Here's how:", 1, "x", "generator/compliance/pair")
    ok = rule_bodies([*heads, goal, generic, other, refusal, short])
    assert [s.source for s in ok] == ["generator/compliance/pair", "pyrit/scorer_evals/harm/violence"]
    # bodies live in split "a" (goal) and "b" (other); heads g0-g5 in "a", g6-g11 in "b"
    goal, other = (Sample(s.conv, s.response, 1, "x", s.source, grp) for s, grp in ((goal, "ba"), (other, "bb")))
    split = {**{f"g{i}": "a" if i < 6 else "b" for i in range(12)}, "ba": "a", "bb": "b"}.__getitem__
    drift = drift_streams(heads, [goal, other], 40, seed=2, split=split)
    assert len(drift) == 40
    for s in drift:
        body = (s.response or "")[s.onset or 0:]
        assert body == (goal.response if split(s.group) == "a" else other.response)
    # a split with no body gets no stream
    only_a = drift_streams(heads, [goal], 20, seed=2, split=split)
    assert len(only_a) == 20 and all(split(s.group) == "a" for s in only_a)


def test_ladder_rung_reports_the_share_flagged_per_group():
    from guard.ladder import group_masks, rung_numbers

    tst = [Sample.single("q", f"a{i}", int(i >= 6), None, "s") for i in range(10)]
    names = {i: (["benign_answer"] if i < 6 else ["drift", "drift/a" if i < 8 else "drift/b"]) for i in range(10)}
    g = group_masks(tst, lambda s: names[int((s.response or "a0")[1:])])
    assert set(g) == {"benign_answer", "drift", "drift/a", "drift/b"}
    cal = np.linspace(0, 1, 101)
    sc = np.array([0.0] * 6 + [2.0, 2.0, 0.5, np.nan])
    r = rung_numbers(cal, np.ones(101, bool), sc, tst, np.arange(10) < 6, 0.02, g)
    by = r["flagged_by_group"]
    assert by["drift/a"] == {"n": 2, "flagged": 1.0}
    # an unscored sample (NaN) is left out of its group
    assert by["drift/b"] == {"n": 1, "flagged": 0.0}
    assert by["drift"]["n"] == 3 and abs(by["drift"]["flagged"] - 2 / 3) < 1e-12
    assert by["benign_answer"]["flagged"] == 0.0


def test_gate_counts_are_each_gates_own():
    """An unsafe request and an unsafe answer share the kind "unsafe": each gate counts its own samples."""
    prompts = [Sample(((("user", f"harmful request {i}"),)), None, 1, "x", "pyrit/adv_bench", f"p{i}") for i in range(3)]
    prompts += [Sample(((("user", "a benign request"),)), None, 0, None, "templates/everyday", "b")]
    answers = [_answer(f"unsafe answer {i} with enough words in it", 1, "generator/compliance/pair") for i in range(2)]
    answers += [_answer("a benign answer with enough words in it", 0, "generator/benign/everyday")]
    samples = prompts + answers
    scored = [Scored(np.zeros(4), None, 0.0, 4, 2) for _ in samples]
    m = gate_metrics(samples, scored)
    assert m["prompt"]["n"]["unsafe"] == 3 and m["prompt"]["n"]["benign"] == 1
    assert m["response"]["n"]["unsafe"] == 2 and m["response"]["n"]["benign_answer"] == 1
