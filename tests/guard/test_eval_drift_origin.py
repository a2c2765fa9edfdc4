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
