"""Pure-core tests: SAE conversion and selected encoder, spans, pooling and scoring, selection, calibration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from guard.monitor import (
    CausalNormFilter,
    GateScorer,
    Head,
    Pooling,
    StreamScorer,
    causal_norm_mask,
    first_crossing,
    peak,
    pool,
    score_sequence,
)
from guard.recipe.calibration import (
    best_f1_threshold,
    operating_point,
    prf,
    threshold_at_budget,
    threshold_at_fpr,
)
from guard.recipe.encode import TokenData
from guard.recipe.selection import (
    HeadConfig,
    diff_scores,
    fit_head,
    head_sample_scores,
    reference_head,
    sample_means,
    token_density,
)
from guard.sae import (
    SelectedEncoder,
    estimate_topk_threshold,
    jumprelu_from_weights,
    load_dictionary_learning_batchtopk,
    load_sae,
    save_sae,
    topk_to_jumprelu,
)
from guard.text import prompt_text, response_text, token_span, user


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


def _rand_jumprelu(d_in=16, d_sae=64, thr=0.3):
    W_enc = torch.randn(d_in, d_sae) / 4
    W_dec = torch.randn(d_sae, d_in) / 4
    return jumprelu_from_weights(W_enc, torch.randn(d_sae) / 10, W_dec, torch.randn(d_in) / 10, thr)


def test_jumprelu_from_weights_matches_manual_encode():
    sae = _rand_jumprelu()
    x = torch.randn(20, 16)
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    expect = torch.relu(pre) * (pre > 0.3)
    torch.testing.assert_close(sae.encode(x), expect)
    assert float(sae.threshold.detach().min()) == pytest.approx(0.3) and float(sae.threshold.detach().max()) == pytest.approx(0.3)


def test_selected_encoder_equals_full_encode_columns(tmp_path):
    sae = _rand_jumprelu()
    ids = [3, 17, 5, 60]
    enc = SelectedEncoder.from_sae(sae, ids)
    x = torch.randn(30, 16)
    torch.testing.assert_close(enc.encode(x), sae.encode(x)[:, ids])
    enc.save(tmp_path / "e")
    enc2 = SelectedEncoder.load(tmp_path / "e")
    assert enc2.ids == ids
    torch.testing.assert_close(enc2.encode(x), enc.encode(x))


def test_selected_encoder_rejects_topk():
    from sae_lens import TopKSAE, TopKSAEConfig

    sae = TopKSAE(TopKSAEConfig(d_in=8, d_sae=32, k=4))
    with pytest.raises(ValueError, match="JumpReLU"):
        SelectedEncoder.from_sae(sae, [0, 1])


def test_topk_conversion_keeps_weights_and_gates_at_threshold(tmp_path):
    from sae_lens import TopKSAE, TopKSAEConfig

    sae = TopKSAE(TopKSAEConfig(d_in=8, d_sae=32, k=4))
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(32) / 5)
    x = torch.randn(256, 8)
    thr = estimate_topk_threshold(sae, x)
    assert thr > 0
    j = topk_to_jumprelu(sae, thr)
    torch.testing.assert_close(j.W_enc, sae.W_enc)
    f = j.encode(x)
    # every non-zero JumpReLU activation is above the threshold, and the top-1 TopK latent survives
    assert bool(((f == 0) | (f > thr)).all())
    top1 = sae.encode(x).argmax(-1)
    frac = (f.gather(1, top1[:, None]) > 0).float().mean()
    assert float(frac) > 0.5
    save_sae(j, tmp_path / "s")
    j2 = load_sae(tmp_path / "s")
    torch.testing.assert_close(j2.encode(x), f)


def test_dictionary_learning_batchtopk_loader(tmp_path):
    d_in, d_sae = 12, 40
    sd = {
        "encoder.weight": torch.randn(d_sae, d_in), "encoder.bias": torch.randn(d_sae),
        "decoder.weight": torch.randn(d_in, d_sae), "b_dec": torch.randn(d_in),
        "threshold": torch.tensor(0.7), "k": torch.tensor(8),
    }
    torch.save(sd, tmp_path / "ae.pt")
    sae = load_dictionary_learning_batchtopk(tmp_path)
    x = torch.randn(5, d_in)
    pre = (x - sd["b_dec"]) @ sd["encoder.weight"].T + sd["encoder.bias"]
    torch.testing.assert_close(sae.encode(x), torch.relu(pre) * (pre > 0.7))
    torch.testing.assert_close(sae.W_dec, sd["decoder.weight"].T)
    sd["threshold"] = torch.tensor(-1.0)
    torch.save(sd, tmp_path / "ae.pt")
    with pytest.raises(ValueError, match="never learned"):
        load_dictionary_learning_batchtopk(tmp_path)


def test_format_and_span_synthetic_offsets():
    fs = response_text(user("hi there"), "ok sure")
    assert fs.text == "User: hi there\nAssistant: ok sure"
    assert fs.text[fs.char_start:fs.char_end] == "ok sure"
    # tokens: "User" ":" " hi" " there" "\n" "Assistant" ":" " ok" " sure"  (BPE puts the space in front)
    offs = [(0, 4), (4, 5), (5, 8), (8, 14), (14, 15), (15, 24), (24, 25), (25, 28), (28, 33)]
    assert token_span(offs, fs.char_start, fs.char_end) == (7, 9)
    p = prompt_text(user("hi there"))
    assert token_span(offs[:4], p.char_start, p.char_end) == (2, 4)
    # special tokens with empty offsets never count
    assert token_span([(0, 0)] + offs, fs.char_start, fs.char_end) == (8, 10)


def test_span_with_a_real_bpe_tokenizer_differs_from_prefix_length_rule():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["User: how do I bake bread\nAssistant: mix flour and water"] * 50,
                           trainers.BpeTrainer(vocab_size=300, show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    fs = response_text(user("how do I bake bread"), "mix flour and water")
    enc = tok(fs.text, return_offsets_mapping=True)
    s, e = token_span(enc["offset_mapping"], fs.char_start, fs.char_end)
    assert tok.decode(enc["input_ids"][s:e]).strip() == "mix flour and water"
    assert e == len(enc["input_ids"])
    # the reference code's rule (length of the prefix tokenised alone) lands one token late here
    prefix = fs.text[:fs.char_start]
    n_prefix = len(tok(prefix)["input_ids"])
    assert tok.decode(enc["input_ids"][n_prefix:e]).strip() != "mix flour and water"


def test_norm_filter_is_causal_and_drops_position_zero():
    norms = np.array([500.0, 1.0, 1.2, 0.9, 1.1, 1.0, 30.0, 1.1])
    m = causal_norm_mask(norms)
    assert m.tolist() == [False, True, True, True, True, True, False, True]
    # appending future tokens never changes earlier decisions (the reference's full-sequence median would)
    m2 = causal_norm_mask(np.concatenate([norms, [1000.0] * 20]))
    assert m2[:8].tolist() == m.tolist()
    f = CausalNormFilter()
    assert [f.step(x) for x in norms] == m.tolist()


def test_pool_is_a_damped_causal_window_mean():
    u = np.array([4.0, 0.0, 0.0, 0.0, 2.0, 2.0])
    c = pool(u, Pooling(window=3, min_count=2), bias=-1.0)
    # t=0: 4/max(1,2); t=1: 4/2; t=2: 4/3; t=3: 0/3; t=4: 2/3; t=5: 4/3
    np.testing.assert_allclose(c, np.array([2.0, 2.0, 4 / 3, 0.0, 2 / 3, 4 / 3]) - 1.0)
    assert pool(u, Pooling(), 0.0).tolist() == u.tolist()      # W = M = 1: the token's own score
    long = pool(np.full(500, 0.5), Pooling(window=16, min_count=4))
    assert long.max() == pytest.approx(0.5)                     # a long answer does not grow its score
    with pytest.raises(ValueError, match="min_count"):
        Pooling(window=4, min_count=5)


def _scorer(pooling=Pooling(window=4, min_count=2)):
    ov = Head([4, 1], [1.0, 0.5], scales=[2.0, 1.0], bias=-0.2, clip=3.0)
    cats = {"violence": Head([4], [1.0], category="violence"), "sexual": Head([2], [1.0], category="sexual")}
    return GateScorer(ov, columns=[1, 2, 4], threshold=0.6, pooling=pooling, categories=cats,
                      category_thresholds={"violence": 1.0, "sexual": 1.0})


@pytest.mark.parametrize("pooling", [Pooling(), Pooling(4, 2), Pooling(16, 4)])
def test_stream_scorer_equals_offline(pooling):
    rng = np.random.default_rng(3)
    T = 40
    acts = rng.exponential(0.6, size=(T, 3))
    norms = rng.uniform(1, 2, size=T)
    norms[0] = 400.0
    norms[17] = 300.0
    sc = _scorer(pooling)
    span = (6, T)
    off = score_sequence(sc, acts, norms, span)
    st = StreamScorer(sc)
    st.context(norms[:6])
    cs, cut = [], None
    for t in range(6, T):
        c, now = st.step(acts[t], norms[t])
        cs.append(c)
        if now and cut is None:
            cut = t - 6
    np.testing.assert_allclose(cs, off.c, rtol=1e-12)
    assert cut == off.cut
    assert off.acts[17 - 6].sum() == 0.0     # the outlier token was filtered


def test_gate_scorer_features_scales_and_clip():
    sc = _scorer(Pooling())
    row = np.array([[0.1, 0.2, 30.0]])
    # latent 4: 30 / 2 clipped at 3, times 1.0; latent 1: 0.1 * 0.5; bias -0.2
    assert sc.scores(row)[0] == pytest.approx(3.0 + 0.05 - 0.2)
    assert sc.top_features(row)[0] == (4, 30.0)
    assert sc.category_of({"violence": 2.0, "sexual": 0.5}) == "violence"
    with pytest.raises(ValueError, match="lack selected"):
        GateScorer(sc.overall, columns=[1, 2], threshold=1.0)


def _token_data(rows_per_sample, width):
    """TokenData from dense per-sample (T, width) arrays."""
    indptr, idx, val, sptr = [0], [], [], [0]
    for a in rows_per_sample:
        for r in a:
            nz = np.flatnonzero(r)
            idx.extend(nz.tolist())
            val.extend(r[nz].tolist())
            indptr.append(indptr[-1] + len(nz))
        sptr.append(sptr[-1] + len(a))
    return TokenData(np.array(indptr), np.array(idx, dtype=np.int32), np.array(val, dtype=np.float32), np.array(sptr), width)


def _planted(n=160, width=24, seed=0):
    """Unsafe samples carry latent 3 on a few tokens; latent 5 fires on most tokens of every sample (dense,
    and more often in long ones); latent 8 marks refusals, which are safe."""
    rng = np.random.default_rng(seed)
    samples, y = [], []
    for i in range(n):
        T = int(rng.integers(8, 120))
        a = np.zeros((T, width), dtype=np.float32)
        noise = rng.random((T, width)) < 0.03
        a[noise] = rng.exponential(1.0, noise.sum())
        a[rng.random(T) < 0.7, 5] = 2.0
        lab = i % 2
        if lab:
            at = int(rng.integers(0, T - 3))
            a[at:at + 3, 3] = 3.0
        elif i % 4 == 0:
            a[: min(4, T), 8] = 2.0
        samples.append(a)
        y.append(lab)
    return _token_data(samples, width), np.array(y)


def test_token_data_sample_max_and_subset():
    td, y = _planted(12)
    X = td.sample_max()
    assert X.shape == (12, 24)
    sub = td.subset([3, 1])
    np.testing.assert_allclose(sub.sample_max(), X[[3, 1]])
    assert sub.lengths().tolist() == td.lengths()[[3, 1]].tolist()
    dense = td.dense_rows(3, [3, 5])
    assert dense.shape == (td.lengths()[3], 2)


def test_reference_rule_and_sparse_readout_find_the_planted_latent():
    td, y = _planted()
    ref = reference_head(td, y, k=3)
    assert ref.ids[0] == 3 and all(w > 0 for w in ref.weights)
    cfg = HeadConfig(window=4, min_count=2, max_latents=4, candidates=24, steps=250, refit_steps=150, max_density=0.5,
                     min_samples=2, threads=1)
    head = fit_head(td, y, cfg)
    w = dict(zip(head.ids, head.weights, strict=True))
    assert 3 in w and w[3] > 0
    assert w.get(5, 0.0) <= 0.25 * w[3]       # the dense latent gets (almost) nothing
    # fitted on sample labels only, the deployed score separates the classes
    sc = head_sample_scores(td, head, cfg.pooling())
    assert sc[y == 1].min() > sc[y == 0].max()
    # and head_sample_scores is the serving scorer's max over each sample
    gs = GateScorer(head, columns=list(range(24)), threshold=0.0, pooling=cfg.pooling())
    for i in (0, 1, 7):
        rows = td.dense_rows(i, list(range(24)))
        assert gs.scores(rows).max() == pytest.approx(sc[i], rel=1e-9)


def test_sample_mean_readout_finds_the_planted_latent_and_serves_through_the_window():
    td, y = _planted()
    cfg = HeadConfig(window=4, min_count=2, max_latents=4, candidates=24, max_density=0.5, min_samples=2, threads=1,
                     fit="sample_mean", c_reg=1.0)
    head = fit_head(td, y, cfg)
    w = dict(zip(head.ids, head.weights, strict=True))
    assert len(head.ids) <= 4 and 3 in w and w[3] > 0
    assert head.scales is None and head.clip is None and head.info["rule"].startswith("sample-mean")
    sc = head_sample_scores(td, head, cfg.pooling())
    assert sc[y == 1].min() > sc[y == 0].max()
    gs = GateScorer(head, columns=list(range(24)), threshold=0.0, pooling=cfg.pooling())
    for i in (0, 1, 7):
        assert gs.scores(td.dense_rows(i, list(range(24)))).max() == pytest.approx(sc[i], rel=1e-9)
    # each sample's mean over its scored tokens, as the fit reads it
    means = sample_means(td, np.array([3, 5]))
    for i in (0, 4):
        assert means[i] == pytest.approx(td.dense_rows(i, [3, 5]).mean(0))
    with pytest.raises(ValueError, match="Available: window_max, sample_mean"):
        HeadConfig(fit="sample-mean")


def test_final_pooling_decides_on_the_last_token_only():
    """A whole-request score: an early spike does not trip the gate, the mean at the end does; offline,
    vectorised and serving scorers agree, and a stream cannot use it."""
    u_spike = np.array([9.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    p = Pooling(window=2048, min_count=1, final=True)
    c = pool(u_spike, p)
    assert c[0] == 9.0 and c[-1] == pytest.approx(1.5)
    assert peak(c, p) == pytest.approx(1.5) and peak(c, Pooling(2048, 1)) == 9.0
    assert first_crossing(c, 2.0, p) is None and first_crossing(c, 2.0, Pooling(2048, 1)) == 0
    assert first_crossing(c, 1.0, p) == 5
    sc = _scorer(p)
    acts = np.zeros((6, 3))
    acts[1, 2] = 5.0                    # latent 4 (column 2): 5 / scale 2, clipped at 3 -> u_1 = 2.5
    off = score_sequence(sc, acts, np.ones(6), (0, 6))
    assert off.c[1] > sc.threshold and off.score == pytest.approx(2.5 / 6 - 0.2) and off.cut is None
    acts[:, 2] = 5.0                    # (the norm filter drops position 0, the attention sink)
    off = score_sequence(sc, acts, np.ones(6), (0, 6))
    assert off.cut == 5 and off.score == pytest.approx(2.5 * 5 / 6 - 0.2)
    td = _token_data([np.pad(acts, ((0, 0), (0, 21))), np.pad(acts[:3] * 0, ((0, 0), (0, 21)))], 24)
    head = Head([2], [1.0], scales=[2.0], bias=-0.2, clip=3.0)
    np.testing.assert_allclose(head_sample_scores(td, head, p), [2.3, -0.2])
    with pytest.raises(ValueError, match="cannot score a stream"):
        StreamScorer(sc)
    # the bundle keeps it (and reads a bundle written before it existed as a windowed pooling)
    from guard.bundle import GateSpec

    spec = GateSpec(head, p, 1.0)
    assert GateSpec.from_dict(spec.to_dict()).pooling.final
    d = spec.to_dict()
    del d["pooling"]["final"]
    assert not GateSpec.from_dict(d).pooling.final


def test_sample_mean_over_all_latents_keeps_a_dense_but_telling_latent_and_balances_classes():
    """The whole-request fit reads every latent that fires in enough samples: a latent that fires on most
    tokens but more often in unsafe requests is kept (the window-max fit's density filter drops it); with
    three benign samples per unsafe one, the balanced fit still recalls the unsafe ones."""
    rng = np.random.default_rng(5)
    rows, y = [], []
    for i in range(240):
        lab = int(i % 4 == 0)
        T = int(rng.integers(10, 40))
        a = np.zeros((T, 24), dtype=np.float32)
        a[rng.random(T) < (0.8 if lab else 0.4), 5] = 1.0
        noise = rng.random((T, 24)) < 0.05
        a[noise] = rng.exponential(1.0, noise.sum())
        rows.append(a)
        y.append(lab)
    td, y = _token_data(rows, 24), np.array(y)
    cfg = HeadConfig(window=2048, min_count=1, max_latents=3, min_samples=5, threads=1, fit="sample_mean_all",
                     c_reg=1.0, final=True, max_density=0.3)
    assert cfg.pooling().final
    head = fit_head(td, y, cfg)
    w = dict(zip(head.ids, head.weights, strict=True))
    assert len(head.ids) <= 3 and w.get(5, 0.0) > 0
    assert "classes balanced" in head.info["rule"]
    sc = head_sample_scores(td, head, cfg.pooling())
    assert np.mean(sc[y == 1] > 0) > 0.8 and np.mean(sc[y == 0] > 0) < 0.2
    # the window-max fit with the same density limit never sees latent 5
    wm = fit_head(td, y, HeadConfig(window=4, min_count=2, max_latents=3, max_density=0.3, min_samples=5, threads=1,
                                    steps=40, refit_steps=20))
    assert 5 not in wm.ids


def test_density_filter_excludes_a_dense_latent_with_a_large_difference():
    td, y = _planted(seed=1)
    dens = token_density(td)
    assert dens[5] > 0.5 and dens[3] < 0.1
    cfg = HeadConfig(window=4, min_count=2, max_latents=4, candidates=24, steps=80, refit_steps=40, max_density=0.3,
                     min_samples=2, threads=1)
    assert 5 not in fit_head(td, y, cfg).ids
    assert diff_scores(td.sample_max(), y)[3] > 0


def test_threshold_at_budget_is_the_lowest_within_the_budget():
    rng = np.random.default_rng(6)
    for n, budget in ((100, 0.02), (37, 0.1), (10, 0.0), (250, 0.05)):
        s = np.round(rng.normal(size=n), 1)     # ties
        t = threshold_at_budget(s, budget)
        assert np.mean(s > t) <= budget + 1e-12
        below = s[s <= t]
        if len(below):
            # any lower threshold at a sample score would flag too many
            assert np.mean(s > below.max() - 1e-9) > budget or below.max() == s.max()
        assert not np.any(s == t)
    op = operating_point(np.array([0.1, 0.9, 0.4, 0.8]), np.array([0, 1, 0, 1]), 0.5, np.array([True, False, True, False]))
    assert op["recall"] == 1.0 and op["flagged_safe"] == 0.0 and op["balanced_accuracy"] == 1.0
    assert op["flagged_benign_traffic"] == 0.0


def test_best_f1_threshold_matches_brute_force():
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = 60
        y = rng.random(n) < 0.4
        y[0] = True
        s = np.round(rng.normal(y * 1.0, 1.0), 1)   # rounded: ties
        cal = best_f1_threshold(s, y)
        brute = max(prf(s > t, y)[2] for t in np.concatenate([[s.min() - 1], s]))
        assert cal.f1 == pytest.approx(brute)
        assert prf(s > cal.threshold, y)[2] == pytest.approx(cal.f1)
        assert not np.any(s == cal.threshold)


def test_threshold_at_fpr_is_the_most_recall_within_the_false_positive_budget():
    rng = np.random.default_rng(5)
    for max_fpr in (0.0, 0.05, 0.2, 1.0):
        n = 80
        y = rng.random(n) < 0.5
        y[:2] = [True, False]
        s = np.round(rng.normal(y * 1.0, 1.0), 1)   # ties
        cal = threshold_at_fpr(s, y, max_fpr)
        fpr = float(np.mean(s[~y] > cal.threshold))
        assert fpr <= max_fpr + 1e-12
        # brute force over every cut point: nothing admissible flags more unsafe samples
        best_r = max(prf(s > t, y)[1] for t in np.concatenate([[s.min() - 1], s])
                     if np.mean(s[~y] > t) <= max_fpr + 1e-12)
        assert cal.recall == pytest.approx(best_r)
        assert not np.any(s == cal.threshold)
    assert threshold_at_fpr(s, y, 1.0).recall == 1.0
    with pytest.raises(ValueError, match="both safe and unsafe"):
        threshold_at_fpr(s[y], y[y], 0.1)


def test_batchtopk_threshold_gives_l0_near_k():
    from guard.recipe.sae import batchtopk_threshold

    sae = _rand_jumprelu(d_in=16, d_sae=64, thr=0.0)
    x = torch.randn(4096, 16)
    thr = batchtopk_threshold(sae, x, k=4.0, batch=512)
    with torch.no_grad():
        sae.threshold.fill_(thr)
        l0 = float((sae.encode(x) > 0).sum(-1).float().mean())
    assert 3.0 < l0 < 5.0


def test_prompt_refit_reads_only_the_monitors_latents_and_replaces_a_weaker_gate():
    from dataclasses import asdict, replace

    from guard.recipe.pipeline import SMOKE, fit_gate, monitor_latents, refit_prompt_gate
    from guard.recipe.sources import Sample

    td, y = _planted(n=240)
    samples = [Sample.single(f"request {i}", None, int(lab), "violence" if lab else None,
                             "advbench" if lab else "templates/everyday") for i, lab in enumerate(y)]
    sel, cal = [i for i in range(240) if i % 4 < 2], [i for i in range(240) if i % 4 >= 2]
    td_sel, td_cal = td.subset(sel), td.subset(cal)
    s_sel, s_cal = [samples[i] for i in sel], [samples[i] for i in cal]
    hc = HeadConfig(window=4, min_count=2, max_latents=4, threads=1)
    cfg = replace(SMOKE, prompt_refit_grid=((4, 2), (8, 2)), prompt_refit_c=1.0, budget_prompt=0.05)

    def gate_reading(ids, weights):
        head = Head(ids=ids, weights=weights, bias=0.0)
        return fit_gate("prompt", td_sel, s_sel, td_cal, s_cal, hc, cfg.budget_prompt, cfg, categories=False, head=head)

    # the window-max prompt read-out reads only noise latents; the planted latent 3 is read by another read-out
    weak = gate_reading([0, 1], [1.0, 1.0])
    fits = {"prompt": weak, "response": gate_reading([3, 7], [0.0, 1.0])}
    assert monitor_latents(fits).tolist() == [0, 1, 3, 7]
    report = {"chosen": weak.calib, "variants": [], "chosen_head": asdict(hc)}
    new = refit_prompt_gate(fits, td_sel, s_sel, td_cal, s_cal, cfg, report)
    assert set(new.spec.overall.ids) <= {0, 1, 3, 7}
    w = dict(zip(new.spec.overall.ids, new.spec.overall.weights, strict=True))
    assert w[3] > 0 and new.spec.overall.info["rule"].startswith("sample-mean")
    assert new.calib["recall"] > weak.calib["recall"] and report["refit"]["replaced_window_max"]
    assert len([v for v in report["variants"] if v["fit"].startswith("sample_mean")]) == 2
    assert new.spec.calibration["head"]["fit"] == "sample_mean"
    assert new.spec.categories                  # the chosen variant names its cuts

    # a gate the refit cannot beat on calibration recall is kept as it was
    strong = gate_reading([3], [1.0])
    fits = {"prompt": strong, "response": gate_reading([0, 7], [1.0, 1.0])}
    report = {"chosen": strong.calib, "variants": [], "chosen_head": asdict(hc)}
    assert refit_prompt_gate(fits, td_sel, s_sel, td_cal, s_cal, cfg, report) is strong
    assert not report["refit"]["replaced_window_max"]


def test_structured_negatives_join_the_prompt_fit_and_its_calibration_traffic():
    """A latent that marks unsafe requests in the select split but fires all over pasted lists (which the
    split lacks) is what a read-out fitted without those lists leans on; fitted with them, it leans on the
    latent that is specific to unsafe requests, and the chosen read-out keeps the lists within the budget."""
    from dataclasses import replace

    from guard.bundle import GateSpec
    from guard.recipe.pipeline import SMOKE, ExtraPrompts, fit_monitor
    from guard.recipe.selection import head_sample_scores
    from guard.recipe.sources import Sample
    from guard.recipe.structured import SOURCE

    rng = np.random.default_rng(3)

    def make(n, kind):
        out = []
        for _ in range(n):
            T = int(rng.integers(10, 60)) if kind != "list" else int(rng.integers(80, 160))
            a = np.zeros((T, 24), dtype=np.float32)
            noise = rng.random((T, 24)) < 0.03
            a[noise] = rng.exponential(1.0, noise.sum())
            if kind == "unsafe":
                at = int(rng.integers(0, T - 6))
                a[at:at + 6, 11] = 3.0          # strong, but also what a list looks like
                a[at + 2:at + 4, 3] = 1.5       # weaker, specific to unsafe requests
            elif kind == "list":
                a[rng.random(T) < 0.5, 11] = 3.0
            out.append(a)
        return out

    def split(n):
        unsafe, safe = make(n, "unsafe"), make(n, "safe")
        td = _token_data(unsafe + safe, 24)
        s = [Sample.single(f"u{i}", None, 1, "violence", "advbench") for i in range(n)] + \
            [Sample.single(f"s{i}", None, 0, None, "templates/everyday") for i in range(n)]
        return td, s

    td_sel, s_sel = split(80)
    td_cal, s_cal = split(80)
    r_sel, r_cal = _token_data(make(40, "list"), 24), _token_data(make(40, "list"), 24)
    lists = [Sample.single(f"l{i}", None, 0, None, SOURCE) for i in range(40)]
    resp_td, resp_s = split(20)
    resp_s = [replace(s, response="answer", source="advbench" if s.label else "generator/benign") for s in resp_s]
    # the window-max fit over a short window, which the list latent misleads without the lists
    cfg = replace(SMOKE, budget_prompt=0.05, prompt_refit_grid=(), head=replace(SMOKE.head, steps=250, refit_steps=150),
                  prompt_head_fit="window_max", prompt_head_final=False, prompt_head_grid=((4, 2, 3e-3, 8),))

    def fit(extra):
        return fit_monitor({"prompt": td_sel, "response": resp_td}, {"prompt": s_sel, "response": resp_s},
                           {"prompt": td_cal, "response": resp_td}, {"prompt": s_cal, "response": resp_s}, cfg,
                           grid=True, extra=extra)

    plain, _ = fit(None)
    g = plain["prompt"].spec
    assert np.mean(head_sample_scores(r_cal, g.overall, g.pooling) >= g.threshold) > 0.5
    fits, report = fit(ExtraPrompts(r_sel, lists, r_cal, lists))
    g = fits["prompt"].spec
    assert report["structured_negatives"] == {"fit": 40, "calibration": 40}
    assert fits["prompt"].calib["recall"] > 0.5
    # an operator's budget keeps the lists' own limit too
    assert g.threshold_for_budget(cfg.budget_prompt) == pytest.approx(g.threshold)
    assert g.threshold_for_budget(0.2) >= GateSpec(g.overall, g.pooling, 0.0, benign_scores=g.own_budget_scores[SOURCE]
                                                   ).threshold_for_budget(0.2)
    # the fit itself moved: the list latent weighs far less against the specific one than without the lists
    w = dict(zip(g.overall.ids, g.overall.weights, strict=True))
    pw = dict(zip(plain["prompt"].spec.overall.ids, plain["prompt"].spec.overall.weights, strict=True))
    assert w.get(11, 0.0) / w[3] < 0.5 * pw.get(11, 0.0) / pw[3]
    # the lists are held to the budget on their own, outside the traffic the threshold is set on
    assert len(g.benign_scores) == 80 and fits["prompt"].calib["n_benign_traffic"] == 80
    assert fits["prompt"].calib["structured_flagged"] <= cfg.budget_prompt


def test_each_generated_source_is_held_to_the_budget_on_its_own():
    """Structured and edgy negatives each keep their own limit: the threshold is the strictest of the usual
    benign traffic's, the structured prompts' and the edgy requests'; neither joins the benign-traffic pool."""
    from guard.recipe.edgy import SOURCE as EDGY
    from guard.recipe.pipeline import budget_threshold
    from guard.recipe.sources import Sample
    from guard.recipe.structured import SOURCE as STRUCT

    rng = np.random.default_rng(0)
    cal = ([Sample.single(f"b{i}", None, 0, None, "templates/everyday") for i in range(200)]
           + [Sample.single(f"s{i}", None, 0, None, STRUCT) for i in range(100)]
           + [Sample.single(f"e{i}", None, 0, None, EDGY) for i in range(100)]
           + [Sample.single(f"u{i}", None, 1, "violence", "advbench") for i in range(50)])
    sc = np.concatenate([rng.normal(0, 1, 200), rng.normal(-3, 1, 100), rng.normal(1.5, 1, 100), rng.normal(4, 1, 50)])
    thr, bt, st, own = budget_threshold(sc, cal, 0.02)
    assert bt.sum() == 200 and st.sum() == 200 and set(own) == {STRUCT, EDGY}
    # the edgy requests score highest of the benign kinds here: theirs is the strictest threshold
    assert thr == pytest.approx(threshold_at_budget(sc[300:400], 0.02))
    assert thr > threshold_at_budget(sc[:200], 0.02) > threshold_at_budget(sc[200:300], 0.02)
    assert np.mean(sc[300:400] > thr) <= 0.02 and np.mean(sc[:200] > thr) < 0.02


def test_direct_requests_are_seeded_harmful_split_by_phrase_and_worded_like_the_edgy_ones():
    from guard.recipe import edgy
    from guard.recipe.direct import FAMILIES, SOURCE, direct_prompts
    from guard.recipe.sources import CATEGORIES, decontaminate

    sel, cal = direct_prompts(300, 7, "select"), direct_prompts(150, 8, "calib")
    assert [s.prompt for s in sel] == [s.prompt for s in direct_prompts(300, 7, "select")]
    assert all(s.label == 1 and s.source == SOURCE and s.response is None for s in sel + cal)
    assert {s.category for s in sel} <= set(CATEGORIES) and {s.category for s in sel} >= {"violence", "sexual", "crime"}
    phrases = [x for _, _, xs in FAMILIES.values() for x in xs]

    def used(ss):
        return {x for x in phrases for s in ss if x.lower() in s.prompt.lower()}

    assert not used(sel) & used(cal)
    assert {s.group.split("/")[2] for s in sel} == set(FAMILIES)
    # the how-to frames are the edgy negatives' too (and so are the lead-ins): the words around a goal carry no label
    edgy_frames = {f for frames, _ in edgy.FAMILIES.values() for f in frames}
    how = {f for _, frames, _ in FAMILIES.values() for f in frames if not f.startswith(("Write", "Can you write", "Give me"))}
    assert how and how <= edgy_frames
    # both generators render a share in lower case, drawn alike, so the register carries no label either
    def lower(ss):
        return np.mean([s.prompt == s.prompt.lower() for s in ss])

    assert 0.08 < lower(direct_prompts(1000, 7, "select")) < 0.22
    assert 0.08 < lower(edgy.edgy_prompts(1000, 7, "select")) < 0.22
    # and none duplicates a reserved benchmark request
    assert all(decontaminate([s.prompt for s in sel + cal]))


def test_edgy_requests_are_seeded_benign_and_split_by_phrase():
    from guard.recipe.edgy import FAMILIES, SOURCE, edgy_prompts

    sel, cal = edgy_prompts(300, 7, "select"), edgy_prompts(150, 8, "calib")
    assert [s.prompt for s in sel] == [s.prompt for s in edgy_prompts(300, 7, "select")]
    assert all(s.label == 0 and s.source == SOURCE and s.response is None for s in sel + cal)
    # no phrase is in both parts: a threshold is never set on a request the read-out was fitted on
    phrases = [x for _, xs in FAMILIES.values() for x in xs]

    def used(ss):
        return {x for x in phrases for s in ss if x.lower() in s.prompt.lower()}

    assert not used(sel) & used(cal)
    # every family shows up in a part, and renderings are distinct until a family runs out
    assert {s.group.split("/")[2] for s in sel} == set(FAMILIES)
    assert len({s.prompt for s in sel}) > 0.9 * len(sel)
    with pytest.raises(ValueError, match="part"):
        edgy_prompts(3, 0, "test")
