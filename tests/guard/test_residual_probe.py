"""The response gate's residual probe: the encoder serves it as extra columns, the gate cuts where either
trigger crosses (offline and streamed alike), and the artifact keeps it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from guard.bundle import GateSpec, MonitorSpec
from guard.monitor import ContextTerm, GateScorer, Head, Pooling, StreamScorer, score_sequence
from guard.sae import SelectedEncoder, probe_id


def _encoder(d: int = 6, k: int = 3, seed: int = 0) -> SelectedEncoder:
    g = torch.Generator().manual_seed(seed)
    return SelectedEncoder(ids=[3, 7, 11], W=torch.randn(d, k, generator=g), b=torch.zeros(k),
                           b_dec=torch.randn(d, generator=g), threshold=torch.full((k,), 0.1),
                           normalize="constant_norm_rescale")


def test_encoder_appends_probe_columns_over_the_raw_residual(tmp_path):
    enc = _encoder()
    x = torch.randn(5, 6) * 30.0
    w = torch.randn(6, 1)
    pe = enc.with_probes(w, [probe_id(0)])
    assert pe.columns == [3, 7, 11, -1] and enc.columns == [3, 7, 11]
    out = pe.encode(x)
    torch.testing.assert_close(out[:, :3], enc.encode(x))
    # the probe reads the residual itself, not the SAE's normalised and centred input
    torch.testing.assert_close(out[:, 3:], x @ w)
    pe.save(tmp_path / "m")
    back = SelectedEncoder.load(tmp_path / "m")
    assert back.columns == pe.columns
    torch.testing.assert_close(back.encode(x), out)
    enc.save(tmp_path / "plain")
    assert SelectedEncoder.load(tmp_path / "plain").probe_W is None
    with pytest.raises(ValueError, match="negative id"):
        enc.with_probes(w, [3])
    with pytest.raises(ValueError, match="negative id"):
        enc.with_probes(torch.randn(6, 2), [-1])


def _gate(pooling: Pooling = Pooling(4, 2), probe_offset: float = 0.0, context: bool = True) -> GateScorer:
    ov = Head([3, 7], [1.0, 0.5], scales=[2.0, 1.0], bias=-0.2, clip=3.0)
    ctx = ContextTerm(Head([7, 11], [0.7, -0.3], bias=5.0), 0.3, 0.2) if context else None
    return GateScorer(ov, columns=[3, 7, 11, -1], threshold=0.6, pooling=pooling, context=ctx,
                      probe=Head([-1], [1.0], None, -1.5, None, "residual_probe"), probe_offset=probe_offset)


@pytest.mark.parametrize("offset", [0.0, 0.9, -2.0])
def test_gate_cuts_where_either_trigger_crosses_offline_and_streamed(offset):
    rng = np.random.default_rng(3)
    T, s, ctx = 60, 10, (1, 8)
    acts = rng.exponential(0.4, size=(T, 4))
    acts[:, 3] = rng.normal(0.0, 0.5, size=T)
    acts[40:48, 3] += 3.0                     # the residual probe's evidence, late in the answer
    norms = rng.uniform(1, 2, size=T)
    norms[20] = 500.0                         # a filtered token counts as zero for both triggers
    sc = _gate(probe_offset=offset)
    plain = GateScorer(sc.overall, sc.columns, sc.threshold, sc.pooling, context=sc.context)
    off = score_sequence(sc, acts, norms, (s, T), context_span=ctx)
    ro = score_sequence(plain, acts, norms, (s, T), context_span=ctx)
    # the probe's own score: the window mean of its column (filtered rows zero), its bias, the offset
    col = acts[s:T, 3] * ro.kept
    n = np.minimum(np.arange(1, T - s + 1), 4)
    cs = np.concatenate([[0.0], np.cumsum(col)])
    idx = np.arange(T - s)
    cp = -1.5 + (cs[idx + 1] - cs[idx + 1 - n]) / np.maximum(n, 2) + offset
    np.testing.assert_allclose(off.c, np.maximum(ro.c, cp), rtol=1e-12)
    first = next((t for t in range(T - s) if ro.c[t] > 0.6 or cp[t] > 0.6), None)
    assert off.cut == first
    st = StreamScorer(sc)
    st.context(norms[:s], acts[:s], ctx)
    streamed = [st.step(acts[t], norms[t]) for t in range(s, T)]
    np.testing.assert_allclose([c for c, _ in streamed], off.c, rtol=1e-12)
    assert next((i for i, (_, cut) in enumerate(streamed) if cut), None) == first
    assert st.last["probe"] == pytest.approx(cp[-1]) and st.last["readout"] == pytest.approx(ro.c[-1])


def test_probe_moves_the_cut_and_a_snapshot_restores_its_window():
    rng = np.random.default_rng(5)
    T = 40
    acts = np.zeros((T, 4))
    acts[:, 3] = 0.5
    acts[25:, 3] = 4.0                        # only the probe sees this part
    norms = np.ones(T)
    with_probe = score_sequence(_gate(context=False), acts, norms, (0, T))
    without = score_sequence(GateScorer(Head([3, 7], [1.0, 0.5], bias=-0.2), [3, 7, 11, -1], 0.6, Pooling(4, 2)),
                             acts, norms, (0, T))
    assert without.cut is None and with_probe.cut is not None and with_probe.cut >= 25
    # a higher offset (the gate's threshold above the probe's own) makes the probe cut sooner, never later
    earlier = score_sequence(_gate(context=False, probe_offset=3.0), acts, norms, (0, T))
    assert earlier.cut is not None and earlier.cut < with_probe.cut
    st = StreamScorer(_gate(context=False))
    for t in range(10):
        st.step(acts[t], norms[t])
    saved = st.snapshot()
    for t in range(25, 30):
        st.step(acts[t], norms[t])
    st.restore(saved)
    cs = [st.step(acts[t], norms[t])[0] for t in range(10, T)]
    np.testing.assert_allclose(cs, with_probe.c[10:], rtol=1e-12)
    del rng
    # a cut the probe made alone names no latent; one the read-out made names its latents
    st = StreamScorer(_gate(context=False))
    for t in range(T):
        if st.step(acts[t], norms[t])[1]:
            break
    assert st.last["readout"] <= 0.6 < st.last["probe"] and st.cut_details()[1] == []
    lit = acts.copy()
    lit[:, 0] = 5.0
    st = StreamScorer(_gate(context=False))
    assert any(st.step(lit[t], 1.0)[1] for t in range(4)) and st.last["readout"] > 0.6
    assert [i for i, _ in st.cut_details()[1]] == [3]


def test_gate_spec_keeps_the_probe_and_its_threshold(tmp_path):
    probe = Head([-1], [1.0], None, -0.7, None, "residual_probe")
    g = GateSpec(Head([3], [1.0], bias=-0.1), Pooling(4, 2), 1.2, probe=probe, probe_threshold=0.4)
    assert g.probe_offset == pytest.approx(0.8)
    back = GateSpec.from_dict(g.to_dict())
    assert back.probe == probe and back.probe_threshold == 0.4 and back.all_ids() == [3]
    with pytest.raises(ValueError, match="own threshold"):
        GateSpec(Head([3], [1.0]), Pooling(4, 2), 1.0, probe=probe)
    # a monitor serves it: the scorer reads the probe's column and carries the offset; an operator's threshold
    # moves both triggers together
    enc = _encoder().with_probes(torch.ones(6, 1), [-1])
    prompt = GateSpec(Head([7], [1.0]), Pooling(8, 1, final=True), 0.5)
    spec = MonitorSpec(enc, {"prompt": prompt, "response": g}, "m")
    spec.save(tmp_path / "m")
    loaded = MonitorSpec.load(tmp_path / "m", "m")
    sc = loaded.scorer("response", threshold=2.0)
    assert sc.columns == [3, 7, 11, -1] and sc.probe == probe and sc.probe_offset == pytest.approx(0.8)
    assert sc.threshold == 2.0
    # a budget chosen at load time holds for each trigger on its own benign scores
    g2 = GateSpec(g.overall, g.pooling, 1.2, benign_scores=list(np.linspace(0, 2, 101)), probe=probe,
                  probe_threshold=0.4, probe_benign_scores=list(np.linspace(-5, -1, 101)))
    assert GateSpec.from_dict(g2.to_dict()).probe_benign_scores == g2.probe_benign_scores
    t, tp = g2.threshold_for_budget(0.05), g2.probe_threshold_for_budget(0.05)
    assert 1.8 < t < 1.92 and -1.2 < tp < -1.16
    spec2 = MonitorSpec(enc, {"prompt": prompt, "response": g2}, "m")
    assert spec2.scorer("response", t, tp).probe_offset == pytest.approx(t - tp)
    with pytest.raises(ValueError, match="no residual probe"):
        prompt.probe_threshold_for_budget(0.05)
    # an older artifact without a probe loads as before
    assert GateSpec.from_dict({k: v for k, v in g.to_dict().items() if not k.startswith("probe")}).probe is None
    with pytest.raises(ValueError, match="lack selected"):
        GateScorer(Head([3], [1.0]), [3, 7], 0.0, probe=probe)


def test_window_means_are_what_the_served_window_scores():
    """A probe's served c_t is its weights against the window mean of the rows, damping included."""
    from guard.monitor import pool
    from guard.recipe.residual_probe import window_means

    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 5))
    w = rng.normal(size=5)
    for p in (Pooling(8, 3), Pooling(1, 1), Pooling(64, 16)):
        np.testing.assert_allclose(window_means(x, p) @ w + 0.7, pool(x @ w, p, 0.7), rtol=1e-5, atol=1e-5)


def _bursts(n: int, rng: np.random.Generator, d: int = 12, length: int = 400, burst: int = 10):
    """Answers of noise; an unsafe one carries direction 0 over a short burst somewhere (its mean barely
    moves) and a faint shift along direction 2 throughout (plain in its mean, lost in any one window's noise);
    every answer has a long stretch along direction 1 whatever its label."""
    spans, y = [], []
    for k in range(n):
        x = rng.normal(size=(length, d)).astype(np.float32)
        a = int(rng.integers(0, length - 60))
        x[a:a + 60, 1] += 2.0
        if k % 2:
            b = int(rng.integers(0, length - burst))
            x[b:b + burst, 0] += 2.5
            x[:, 2] += 0.15
        spans.append(x)
        y.append(k % 2)
    return spans, np.array(y)


def test_window_probe_finds_a_short_unsafe_burst_the_mean_fit_dilutes():
    from guard.ladder import fit_probe
    from guard.recipe.residual_probe import fit_window_probe, served_recall, window_means

    rng = np.random.default_rng(1)
    p = Pooling(8, 4)
    spans, y = _bursts(200, rng)
    cal, yc = _bursts(200, rng)
    pooled = np.stack([x.mean(0) for x in spans])
    mean_fit = fit_probe(pooled, y, np.stack([x.mean(0) for x in cal]), yc)
    win = fit_window_probe([window_means(x, p) for x in spans], y, mean_fit, p, 0.1)
    benign = yc == 0
    r_mean = served_recall(mean_fit.streamed_dense(cal, p), yc, benign, 0.05)
    r_win = served_recall(win.streamed_dense(cal, p), yc, benign, 0.05)
    assert r_win >= 0.9 and r_win > r_mean + 0.1, (r_win, r_mean)
    # it reads the burst, not the stretch every answer has
    u = win.w / np.linalg.norm(win.w)
    assert u[0] > 0.5 and abs(u[1]) < 0.2, u


def test_a_window_probe_needs_both_labels():
    from guard.ladder import LinearProbe
    from guard.recipe.residual_probe import fit_window_probe, window_means

    x = [window_means(np.ones((5, 3), np.float32), Pooling(2, 1))] * 3
    with pytest.raises(ValueError, match="safe and unsafe"):
        fit_window_probe(x, np.zeros(3, int), LinearProbe(np.ones(3), 0.0, 1.0), Pooling(2, 1), 1.0)


def test_build_config_refuses_an_unknown_probe_fit():
    from dataclasses import replace

    from guard.recipe.pipeline import PRESETS

    with pytest.raises(ValueError, match="did you mean 'window_max'"):
        replace(PRESETS["cpu"], response_probe_fit="window-max")
    with pytest.raises(ValueError, match="Cs > 0"):
        replace(PRESETS["cpu"], response_probe_c=())
    assert replace(PRESETS["cpu"], response_probe_fit="mean", response_probe_c=()).response_probe_fit == "mean"
