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


def test_hand_annotation_splits_drift_streams_and_matches_the_committed_data(tmp_path):
    import gzip
    import json
    from pathlib import Path

    from guard.evaluate import eval_groups, read_drift_annotation, sample_hash

    root = Path(__file__).resolve().parents[2]
    ann_path = root / "guard" / "eval_report" / "drift-test-unsafe-parts-annotated.json"
    ann = read_drift_annotation(ann_path)
    with gzip.open(root / "guard" / "artifacts" / "data.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    samples = [Sample.from_json({k: v for k, v in r.items() if k != "split"}) for r in rows]
    # every annotated stream is a test-split drift stream of the committed data, found by its hash
    test_drift = {sample_hash(s): s for s, r in zip(samples, rows, strict=True)
                  if r["split"] == "test" and s.source == "constructed/drift"}
    assert set(ann) <= set(test_drift) and len(ann) == json.loads(ann_path.read_text())["n"]
    bodies = drift_bodies(samples)
    groups = eval_groups(bodies, ann)
    by = [groups(test_drift[h]) for h in sorted(ann)]
    assert all(g[:2] == ["drift", "drift/served_model_compliance"] for g in by)
    harmful = sum(g[2] == "drift/served_model_compliance/harm_in_text" for g in by)
    assert harmful == sum(ann.values()) and 0 < harmful < len(ann)
    # the groups reach the drift report: cut only the streams annotated harmful in their own words
    ds = [test_drift[h] for h in sorted(ann)]
    scored = [Scored(np.zeros(40), 30 if ann[h] else None, 0.0, 40, 20) for h in sorted(ann)]
    d = gate_metrics(ds, scored, bodies, ann)["drift"]["by_unsafe_part"]
    assert d["served_model_compliance/harm_in_text"]["cut_rate"] == 1.0
    assert d["served_model_compliance/harmless_text"]["cut_rate"] == 0.0
    assert d["served_model_compliance"]["cut_rate"] == harmful / len(ann)
    # a sample that is not a drift stream gets only its kind; a drift stream not annotated, no annotation group
    other = next(s for s in samples if s.source != "constructed/drift" and s.gate == "response" and s.label)
    assert groups(other) == ["unsafe"]
    unannotated = next(s for h, s in test_drift.items() if h not in ann)
    assert len(groups(unannotated)) == 2


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
