"""The prompt gate's residual probe: added to the read-out's score (not a trigger of its own), kept beside the
response gate's probe in one encoder, and fitted so that the sum's threshold holds the budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from guard.bundle import GateSpec, MonitorSpec
from guard.ladder import fit_hidden_probe, fit_probe
from guard.monitor import (
    GateScorer,
    Head,
    HiddenLayer,
    Pooling,
    StreamScorer,
    causal_norm_mask,
    pool,
    score_sequence,
)
from guard.recipe.calibration import average_precision
from guard.recipe.prompt_probe import fit_prompt_probe
from guard.recipe.residual_probe import add_probe_column, without_probe
from guard.recipe.sources import Sample
from guard.sae import SelectedEncoder, probe_id
from guard.text import user

D = 6


def _encoder(seed: int = 0) -> SelectedEncoder:
    g = torch.Generator().manual_seed(seed)
    return SelectedEncoder(ids=[3, 7, 11], W=torch.randn(D, 3, generator=g), b=torch.zeros(3),
                           b_dec=torch.randn(D, generator=g), threshold=torch.full((3,), 0.1),
                           normalize="constant_norm_rescale")


FINAL = Pooling(2048, 1, final=True)
PROBE = Head([-1], [1.0], None, -0.4, None, "residual_probe")


def test_an_added_probe_scores_the_sum_of_the_two():
    rng = np.random.default_rng(0)
    T, span = 30, (4, 30)
    acts = np.abs(rng.normal(0.5, 0.4, size=(T, 4)))
    acts[:, 3] = rng.normal(0.0, 1.0, size=T)
    norms = rng.uniform(1, 2, size=T)
    norms[12] = 400.0                               # filtered: zero in both parts
    ov = Head([3, 7], [1.0, 0.5], bias=-0.2)
    plain = GateScorer(ov, [3, 7, 11, -1], 0.5, FINAL)
    added = GateScorer(ov, [3, 7, 11, -1], 0.5, FINAL, probe=PROBE, probe_weight=0.7)
    a = score_sequence(plain, acts, norms, span)
    b = score_sequence(added, acts, norms, span)
    kept = causal_norm_mask(norms, 10.0)[span[0]:span[1]]
    u = acts[span[0]:span[1], 3] * kept
    want = a.c + 0.7 * pool(u, FINAL, PROBE.bias)
    np.testing.assert_allclose(b.c, want, rtol=1e-12)
    assert b.score == pytest.approx(a.score + 0.7 * (PROBE.bias + u.mean()))
    # the sum is not the larger of the two: a trigger-style probe at the same place scores differently
    trig = GateScorer(ov, [3, 7, 11, -1], 0.5, FINAL, probe=PROBE, probe_offset=0.0)
    assert score_sequence(trig, acts, norms, span).score != pytest.approx(b.score)
    # a stream has no last token to score the sum at
    with pytest.raises(ValueError, match="added to its score"):
        StreamScorer(GateScorer(ov, [3, 7, 11, -1], 0.5, Pooling(4, 2), probe=PROBE, probe_weight=0.7))


def test_gate_spec_keeps_the_weight_and_budgets_read_the_sum(tmp_path):
    g = GateSpec(Head([7], [1.0], bias=-0.1), FINAL, 1.1, benign_scores=list(np.linspace(0, 2, 101)), probe=PROBE,
                 probe_weight=0.8)
    back = GateSpec.from_dict(g.to_dict())
    assert back.probe == PROBE and back.probe_weight == 0.8 and back.probe_threshold is None
    assert back.probe_offset == 0.0
    with pytest.raises(ValueError, match="exactly one"):
        GateSpec(Head([7], [1.0]), FINAL, 1.0, probe=PROBE, probe_threshold=0.2, probe_weight=0.8)
    with pytest.raises(ValueError, match="needs a residual probe"):
        GateSpec(Head([7], [1.0]), FINAL, 1.0, probe_weight=0.8)
    # the budget's threshold is on the sum's benign scores; the probe has none of its own
    assert 1.8 < g.threshold_for_budget(0.05) < 1.92
    with pytest.raises(ValueError, match="added"):
        g.probe_threshold_for_budget(0.05)
    enc = _encoder().with_probes(torch.ones(D, 1), [-1])
    resp = GateSpec(Head([3], [1.0]), Pooling(4, 2), 0.5)
    spec = MonitorSpec(enc, {"prompt": g, "response": resp}, "m")
    spec.save(tmp_path / "m")
    sc = MonitorSpec.load(tmp_path / "m", "m").scorer("prompt", threshold=1.5)
    assert sc.probe_weight == 0.8 and sc.probe == PROBE and sc.threshold == 1.5
    with pytest.raises(ValueError, match="no threshold of its own"):
        spec.scorer("prompt", 1.5, 0.3)


def test_probe_columns_are_added_and_taken_out_per_gate():
    enc = _encoder()
    e1, p1 = add_probe_column(enc, np.ones(D))
    e2, p2 = add_probe_column(e1, np.arange(D, dtype=np.float32))
    assert (p1, p2) == (probe_id(0), probe_id(1)) and e2.columns == [3, 7, 11, -1, -2]
    prompt_head = Head([p2], [1.0], None, 0.3, None, "residual_probe")
    prompt = GateSpec(Head([7], [1.0]), FINAL, 2.5, benign_scores=[2.0, 2.4], own_budget_scores={"g/x": [1.0]},
                      calibration={"calib": {"a": 1}, "probe": {"readout_threshold": 1.25,
                                                                "readout_benign_scores": [0.5, 1.0],
                                                                "readout_own_budget_scores": {"g/x": [0.2]}}},
                      probe=prompt_head, probe_weight=0.5)
    resp = GateSpec(Head([3], [1.0]), Pooling(4, 2), 0.7, probe=Head([p1], [1.0], None, -1.0), probe_threshold=0.1)
    spec = MonitorSpec(e2, {"prompt": prompt, "response": resp}, "m")
    x = torch.randn(5, D)
    # taking the prompt probe out keeps the response probe's column and gives the read-out its calibration back
    a = without_probe(spec, "prompt")
    assert a.encoder.columns == [3, 7, 11, -1] and a.gates["response"] == resp
    pa = a.gates["prompt"]
    assert pa.probe is None and pa.probe_weight is None and pa.threshold == 1.25
    assert pa.benign_scores == [0.5, 1.0] and pa.own_budget_scores == {"g/x": [0.2]} and "probe" not in pa.calibration
    torch.testing.assert_close(a.encoder.encode(x), e2.encode(x)[:, :4])
    # and the other way round
    b = without_probe(spec, "response")
    assert b.encoder.columns == [3, 7, 11, -2] and b.gates["prompt"] == prompt
    torch.testing.assert_close(b.encoder.encode(x)[:, 3], e2.encode(x)[:, 4])
    assert without_probe(b, "response") is b
    # a fresh column takes the first free id
    assert add_probe_column(b.encoder, np.ones(D))[1] == probe_id(0)


def _samples(n: int, rng: np.random.Generator, tag: str) -> tuple[list[Sample], dict[str, tuple[torch.Tensor, tuple[int, int]]]]:
    """Prompts whose label shows in a residual direction the read-out's latents hardly see, and their rows."""
    out, rows = [], {}
    direction = np.zeros(D)
    direction[5] = 1.0
    for i in range(n):
        y = int(i % 3 == 0)
        s = Sample(user(f"{tag} request {i}"), None, y, None, "templates/pair" if y else "templates/everyday",
                   f"{tag}-{i}")
        T = int(rng.integers(6, 14))
        r = rng.normal(0.0, 1.0, size=(T, D)) + (2.5 * y - 0.5) * direction
        rows[s.group] = (torch.tensor(r, dtype=torch.float32), (2, T))
        out.append(s)
    return out, rows


def _fitting_prompts() -> tuple[list[Sample], list[Sample], Callable[[Sequence[Sample]], list[Any]]]:
    """Select and calibration prompts, and the rows a fit reads for them."""
    rng = np.random.default_rng(1)
    sel, r1 = _samples(240, rng, "sel")
    cal, r2 = _samples(240, rng, "cal")
    table = {**r1, **r2}

    def rows(ss: Sequence[Sample]) -> list[Any]:
        return [table[s.group] for s in ss]

    return sel, cal, rows


def _served_benign_scores(spec: MonitorSpec, cal: list[Sample], rows: Callable[[Sequence[Sample]], list[Any]]
                          ) -> list[float]:
    """The prompt gate's served score of each benign prompt of ``cal``, sorted (as the fit records them)."""
    sc = spec.scorer("prompt")
    benign = [s for s in cal if s.label == 0]
    return sorted(score_sequence(sc, spec.encoder.encode(resid).numpy(), resid.norm(dim=-1).numpy(), span).score
                  for resid, span in rows(benign))


def test_fit_adds_a_probe_that_holds_the_budget_and_scores_as_served():
    sel, cal, rows = _fitting_prompts()
    enc, _ = add_probe_column(_encoder(), np.ones(D))           # the response gate's probe, already there
    prompt = GateSpec(Head([3, 7], [0.6, 0.4], bias=-0.5), FINAL, 0.9, benign_scores=[0.1, 0.5, 0.8])
    resp = GateSpec(Head([3], [1.0]), Pooling(4, 2), 0.7, probe=Head([-1], [1.0], None, -1.0), probe_threshold=0.1)
    spec = MonitorSpec(enc, {"prompt": prompt, "response": resp}, "m")
    new, rec = fit_prompt_probe(spec, rows, sel, cal, budget=0.05)
    g = new.gates["prompt"]
    assert g.probe is not None and g.probe_weight is not None and g.probe_weight > 0
    assert new.encoder.columns == [3, 7, 11, -1, -2] and new.gates["response"] == resp
    assert rec["readout_threshold"] == 0.9
    # the probe sees what the read-out does not, and the sum's threshold holds the budget on benign traffic
    assert rec["calibration"]["with_probe"]["balanced_accuracy"] > rec["calibration"]["readout_only"]["balanced_accuracy"] + 0.1
    assert rec["calibration"]["with_probe"]["flagged_benign_traffic"] <= 0.05
    assert len(g.benign_scores) == sum(1 for s in cal if s.label == 0)
    # the served score of a calibration prompt is the sum the fit thresholded
    np.testing.assert_allclose(_served_benign_scores(new, cal, rows), g.benign_scores, rtol=1e-5, atol=1e-5)
    # refitting replaces the prompt probe's column rather than adding another
    again, _ = fit_prompt_probe(new, rows, sel, cal, budget=0.05)
    assert again.encoder.columns == [3, 7, 11, -1, -2] and again.gates["prompt"].threshold == pytest.approx(g.threshold)
    with pytest.raises(ValueError, match="prompt samples only"):
        fit_prompt_probe(spec, rows, sel + [Sample(user("q"), "a", 0, None, "generator/benign/x", "z")], cal, 0.05)


def test_a_hidden_layer_probe_pools_its_units_then_applies_them():
    rng = np.random.default_rng(3)
    T, span = 25, (3, 25)
    acts = rng.normal(0.0, 1.0, size=(T, 5))
    norms = rng.uniform(1, 2, size=T)
    norms[9] = 300.0                                # filtered: its units count as zero in the pool
    ov = Head([3], [1.0], bias=-0.1)
    units = HiddenLayer([0.2, -0.3], [1.5, -0.7])
    head = Head([-1, -2], [1.0, 1.0], None, 0.25, None, "residual_probe")
    cols = [3, 7, 11, -1, -2]
    sc = GateScorer(ov, cols, 0.5, FINAL, probe=head, probe_weight=0.6, probe_hidden=units)
    got = score_sequence(sc, acts, norms, span)
    kept = causal_norm_mask(norms, 10.0)[span[0]:span[1]]
    mean_units = (acts[span[0]:span[1], 3:5] * kept[:, None]).mean(0)
    probe = 0.25 + np.maximum(mean_units + [0.2, -0.3], 0.0) @ [1.5, -0.7]
    plain = score_sequence(GateScorer(ov, cols, 0.5, FINAL), acts, norms, span)
    assert got.score == pytest.approx(plain.score + 0.6 * probe, rel=1e-12)
    # the ReLU comes after the pool: applied per token first, the score would differ
    per_token = 0.25 + (np.maximum(acts[span[0]:span[1], 3:5] * kept[:, None] + [0.2, -0.3], 0.0) @ [1.5, -0.7]).mean()
    assert probe != pytest.approx(per_token)
    with pytest.raises(ValueError, match="one column per unit"):
        GateScorer(ov, cols, 0.5, FINAL, probe=Head([-1], [1.0]), probe_weight=0.6, probe_hidden=units)
    with pytest.raises(ValueError, match="one column per unit"):
        GateScorer(ov, cols, 0.5, FINAL, probe=head, probe_offset=0.0, probe_hidden=units)
    with pytest.raises(ValueError, match="one bias and one output weight"):
        HiddenLayer([0.1], [1.0, 2.0])
    # kept by the artifact format, and written only where there is one
    g = GateSpec(ov, FINAL, 0.5, probe=head, probe_weight=0.6, probe_hidden=units)
    assert GateSpec.from_dict(g.to_dict()).probe_hidden == units
    assert "probe_hidden" not in GateSpec(ov, FINAL, 0.5, probe=head, probe_weight=0.6).to_dict()
    with pytest.raises(ValueError, match="hidden layer needs"):
        GateSpec(ov, FINAL, 0.5, probe=head, probe_threshold=0.1, probe_hidden=units)


def test_hidden_probe_fit_folds_its_scaling_and_reads_what_a_line_cannot():
    # the label is |x0| > 1: no line separates it, one hidden layer does
    rng = np.random.default_rng(4)

    def draw(n):
        X = rng.normal(0.0, 1.0, size=(n, 4)) * [1.0, 1.0, 5.0, 0.2] + [0.0, 0.0, 10.0, -3.0]
        return X, (np.abs(X[:, 0]) > 1.0).astype(int)

    X, y = draw(1200)
    Xc, yc = draw(600)
    Xt, yt = draw(600)
    hp = fit_hidden_probe(X, y, Xc, yc, units=32, seeds=2, epochs=60)
    lin = fit_probe(X, y, Xc, yc)
    assert hp.W1.shape == (4, 64) and hp.b1.shape == (64,) and hp.w2.shape == (64,)
    assert average_precision(hp.pooled(Xt), yt) > 0.9 > average_precision(lin.pooled(Xt), yt) + 0.3
    assert hp.info["units"] == 32 and len(hp.info["calib_average_precision_per_seed"]) == 2
    # the served form (units pooled, then the layer) is the probe on the mean
    x = rng.normal(0.0, 1.0, size=(7, 4))
    layer = HiddenLayer(list(hp.b1), list(hp.w2))
    served = hp.b2 + layer.apply(pool(x @ hp.W1, FINAL))[-1]
    assert served == pytest.approx(hp.pooled(x.mean(0, keepdims=True))[0], rel=1e-9)


def test_fit_with_a_hidden_layer_serves_one_column_per_unit():
    sel, cal, rows = _fitting_prompts()
    prompt = GateSpec(Head([3, 7], [0.6, 0.4], bias=-0.5), FINAL, 0.9, benign_scores=[0.1, 0.5, 0.8])
    resp = GateSpec(Head([3], [1.0]), Pooling(4, 2), 0.7)
    spec = MonitorSpec(_encoder(), {"prompt": prompt, "response": resp}, "m")
    new, rec = fit_prompt_probe(spec, rows, sel, cal, budget=0.05, hidden=4)
    g = new.gates["prompt"]
    units = 4 * rec["hidden"]["seeds"]
    assert g.probe_hidden is not None and len(g.probe_hidden.weights) == units
    assert new.encoder.columns == [3, 7, 11, *(probe_id(j) for j in range(units))]
    assert rec["calibration"]["with_probe"]["flagged_benign_traffic"] <= 0.05
    np.testing.assert_allclose(_served_benign_scores(new, cal, rows), g.benign_scores, rtol=1e-5, atol=1e-5)
    # taking it out removes every unit's column; a logistic refit then adds one column again
    back = without_probe(new, "prompt")
    assert back.encoder.columns == [3, 7, 11] and back.gates["prompt"].probe_hidden is None
    lin, _ = fit_prompt_probe(new, rows, sel, cal, budget=0.05)
    assert lin.encoder.columns == [3, 7, 11, -1] and lin.gates["prompt"].probe_hidden is None


def test_a_line_beside_the_hidden_layer_is_one_more_column_read_as_it_pools():
    layer = HiddenLayer([0.2, -0.3], [1.5, -0.7], [0.4])
    pooled = np.array([[0.5, 0.1, -2.0], [-1.0, 0.6, 3.0]])
    want = np.maximum(pooled[:, :2] + [0.2, -0.3], 0.0) @ [1.5, -0.7] + 0.4 * pooled[:, 2]
    np.testing.assert_allclose(layer.apply(pooled), want, rtol=1e-12)
    assert layer.n_columns == 3 and HiddenLayer.from_dict(layer.to_dict()) == layer
    # the artifact of a layer without a line reads as before
    assert "linear" not in HiddenLayer([0.2], [1.5]).to_dict()
    ov = Head([3], [1.0], bias=-0.1)
    with pytest.raises(ValueError, match="per linear weight"):
        GateScorer(ov, [3, -1, -2], 0.5, FINAL, probe=Head([-1, -2], [1.0, 1.0]), probe_weight=0.6,
                   probe_hidden=layer)


def test_a_fit_with_a_line_serves_the_sum_of_the_two_probes():
    rng = np.random.default_rng(5)

    def draw(n):
        X = rng.normal(0.0, 1.0, size=(n, 4)) * [1.0, 1.0, 5.0, 0.2] + [0.0, 0.0, 10.0, -3.0]
        return X, ((np.abs(X[:, 0]) > 1.0) | (X[:, 1] > 1.5)).astype(int)

    X, y = draw(800)
    Xc, yc = draw(400)
    hp = fit_hidden_probe(X, y, Xc, yc, units=8, seeds=1, epochs=20)
    both = fit_hidden_probe(X, y, Xc, yc, units=8, seeds=1, epochs=20, linear=True)
    lin = fit_probe(X, y, Xc, yc)
    lam = both.info["linear"]["weight"]
    # the same hidden layer (same seeds), plus the logistic line at the spread ratio over the negatives
    np.testing.assert_allclose(both.W1, hp.W1)
    np.testing.assert_allclose(both.w2, hp.w2)
    assert lam == pytest.approx(np.std(hp.pooled(Xc[yc == 0])) / np.std(lin.pooled(Xc[yc == 0])), rel=1e-9)
    np.testing.assert_allclose(both.pooled(Xc), hp.pooled(Xc) + lam * lin.pooled(Xc), rtol=1e-9, atol=1e-9)
    # served: the units and the line as encoder columns, the layer after the pool, is the probe on the mean
    sel, cal, rows = _fitting_prompts()
    prompt = GateSpec(Head([3, 7], [0.6, 0.4], bias=-0.5), FINAL, 0.9, benign_scores=[0.1, 0.5, 0.8])
    spec = MonitorSpec(_encoder(), {"prompt": prompt, "response": GateSpec(Head([3], [1.0]), Pooling(4, 2), 0.7)},
                       "m")
    new, rec = fit_prompt_probe(spec, rows, sel, cal, budget=0.05, hidden=4, linear=True)
    g = new.gates["prompt"]
    units = 4 * rec["hidden"]["seeds"]
    assert g.probe_hidden is not None and len(g.probe_hidden.weights) == units and g.probe_hidden.linear == [1.0]
    assert new.encoder.columns == [3, 7, 11, *(probe_id(j) for j in range(units + 1))]
    assert rec["hidden"]["linear"]["weight"] > 0
    np.testing.assert_allclose(_served_benign_scores(new, cal, rows), g.benign_scores, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="needs a hidden layer"):
        fit_prompt_probe(spec, rows, sel, cal, budget=0.05, linear=True)
    # and a build asking for it without a hidden layer fails before any stage runs
    from guard.recipe.pipeline import BuildConfig

    with pytest.raises(ValueError, match="needs prompt_probe_hidden"):
        BuildConfig(prompt_probe_hidden=0, prompt_probe_linear=True)


def test_probe_by_depth_finds_the_layer_that_holds_the_signal():
    """Of two depths, only the one whose features carry the label reads the held-out sets; the learning curve
    refits on fewer select samples and is scored like the full fit."""
    from guard.ladder import probe_by_depth

    # a seed other than the ladder's own, whose draws pick the learning curve's samples
    rng = np.random.default_rng(7)
    parts = {"select": 400, "calib": 200, "test": 200, "fresh_harmful": 60, "fresh_benign_edgy": 60}
    labels = {k: (rng.random(n) < 0.5).astype(int) for k, n in parts.items()}
    labels["fresh_harmful"][:] = 1
    labels["fresh_benign_edgy"][:] = 0
    feats = {}
    for k, y in labels.items():
        signal = rng.normal(size=(len(y), 8))
        signal[:, 0] += 3.0 * (2 * y - 1)
        feats[k] = {0: rng.normal(size=(len(y), 8)), 1: signal}

    def threshold_at(sc):
        benign = sc[labels["calib"] == 0]
        return float(np.quantile(benign, 0.98))

    rep = probe_by_depth(lambda part, layer: feats[part][layer], labels, threshold_at,
                         ["fresh_harmful", "fresh_benign_edgy"], [0, 1], curve_layer=1)
    noise, signal = rep["depths"]["0"], rep["depths"]["1"]
    assert signal["mean_pair_balanced_accuracy"] > 0.9 > 0.6 > noise["mean_pair_balanced_accuracy"]
    assert signal["test_balanced_accuracy"] > 0.9 and noise["test_balanced_accuracy"] < 0.6
    assert signal["flagged"]["fresh_benign_edgy"] <= 0.1
    points = rep["learning_curve"]["points"]
    assert [p["fraction"] for p in points] == [0.25, 0.25, 0.5, 0.5, 0.75, 0.75]
    assert all(p["n_select"] < 400 and p["mean_pair_balanced_accuracy"] > 0.8 for p in points)
