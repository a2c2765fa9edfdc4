"""Pure-core tests: SAE conversion and selected encoder, spans, selection, aggregation, calibration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from guard.calibrate import Thresholds, best_f1_threshold, prf, threshold_at_fpr
from guard.features import (
    FeatureSet,
    GateFeatures,
    diff_scores,
    format_sample,
    sample_max,
    select_features,
    select_gate_features,
    token_density,
    token_span,
)
from guard.monitor import (
    CausalNormFilter,
    GateScorer,
    StreamScorer,
    aggregate,
    causal_norm_mask,
    first_cut,
    score_sequence,
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
    fs = format_sample("hi there", "ok sure")
    assert fs.text == "User: hi there\nAssistant: ok sure"
    assert fs.text[fs.char_start:fs.char_end] == "ok sure"
    # tokens: "User" ":" " hi" " there" "\n" "Assistant" ":" " ok" " sure"  (BPE puts the space in front)
    offs = [(0, 4), (4, 5), (5, 8), (8, 14), (14, 15), (15, 24), (24, 25), (25, 28), (28, 33)]
    assert token_span(offs, fs.char_start, fs.char_end) == (7, 9)
    p = format_sample("hi there")
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
    fs = format_sample("how do I bake bread", "mix flour and water")
    enc = tok(fs.text, return_offsets_mapping=True)
    s, e = token_span(enc["offset_mapping"], fs.char_start, fs.char_end)
    assert tok.decode(enc["input_ids"][s:e]).strip() == "mix flour and water"
    assert e == len(enc["input_ids"])
    # the reference code's rule (length of the prefix tokenised alone) lands one token late here
    prefix = fs.text[:fs.char_start]
    n_prefix = len(tok(prefix)["input_ids"])
    assert tok.decode(enc["input_ids"][n_prefix:e]).strip() != "mix flour and water"


def test_sample_max_uses_only_valid_span():
    a = np.zeros((5, 3), dtype=np.float32)
    a[0, 0] = 9.0   # context token: must not count
    a[3, 1] = 2.0
    X = sample_max([a, a], [(2, 5), (0, 0)])
    assert X[0].tolist() == [0.0, 2.0, 0.0]
    assert X[1].tolist() == [0.0, 0.0, 0.0]


def _planted(n=400, d=50, planted=(7, 21, 33)):
    rng = np.random.default_rng(1)
    y = rng.random(n) < 0.5
    X = rng.exponential(1.0, size=(n, d)).astype(np.float32)
    for j in planted:
        X[y, j] += 2.0
    # a latent with a big mean difference but huge variance: per-feature sigma must demote it
    X[:, 45] = rng.normal(0, 30, size=n) ** 2
    X[y, 45] += 6.0
    return X, y


def test_selection_recovers_planted_latents_both_sigmas():
    X, y = _planted()
    for sigma in ("per_feature", "global"):
        fs = select_features(X, y, k=3, sigma=sigma)   # type: ignore[arg-type]
        if sigma == "per_feature":
            assert set(fs.ids) == {7, 21, 33}
        else:
            # the reference quirk ranks by the raw mean difference, so the noisy latent wins
            assert fs.ids[0] == 45
        assert all(w > 0 for w in fs.weights)
        assert fs.weights == sorted(fs.weights, reverse=True)


def test_global_sigma_ranking_is_raw_mean_difference():
    X, y = _planted()
    s = diff_scores(X, y, "global")
    raw = X[y].mean(0) - X[~y].mean(0)
    assert np.argsort(-s).tolist() == np.argsort(-raw).tolist()
    with pytest.raises(ValueError, match="Available"):
        diff_scores(X, y, "bogus")   # type: ignore[arg-type]


def test_selection_keeps_only_positive_scores():
    X, y = _planted()
    X2 = X.copy()
    X2[:, :] = 1.0
    X2[y, 3] = 2.0
    fs = select_features(X2, y, k=32)
    assert fs.ids == [3]


def test_per_category_sets():
    rng = np.random.default_rng(2)
    n, d = 300, 20
    cats = rng.choice(["violence", "sexual"], size=n).tolist()
    y = rng.random(n) < 0.6
    X = rng.exponential(1.0, size=(n, d))
    for i in range(n):
        if y[i]:
            X[i, 2 if cats[i] == "violence" else 9] += 3.0
    cats = [c if lab else None for c, lab in zip(cats, y, strict=True)]
    gf = select_gate_features(X, y, cats, k=1)
    assert gf.categories["violence"].ids == [2]
    assert gf.categories["sexual"].ids == [9]
    gf2 = GateFeatures.from_dict(gf.to_dict())
    assert gf2.all_ids() == sorted({gf.overall.ids[0], 2, 9})


def _token_acts(n=200, d=12, seed=3):
    """Per-token activations: latent 0 is dense (fires on every valid token, a bit higher on unsafe samples,
    so its sample max has a large standardised difference); latent 5 is sparse and fires only on some
    tokens of unsafe samples, with a smaller difference."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2 == 0
    acts, spans = [], []
    for i in range(n):
        t = int(rng.integers(10, 30))
        a = np.zeros((t + 3, d), dtype=np.float32)          # 3 prefix tokens outside the span
        a[:, 0] = 1.0 + rng.random(t + 3) * 0.1 + (0.5 if y[i] else 0.0)
        for j in range(1, d):
            on = rng.random(t + 3) < 0.05
            a[on, j] = rng.exponential(1.0, on.sum())
        if y[i] and rng.random() < 0.7:
            a[3 + int(rng.integers(0, t)), 5] = 2.0
        acts.append(a)
        spans.append((3, t + 3))
    return acts, spans, y


def test_token_density_counts_valid_kept_tokens_without_labels():
    a = np.zeros((5, 3), dtype=np.float32)
    a[:, 0] = 1.0                       # fires everywhere
    a[1, 1] = 2.0                       # one token inside the span
    a[0, 2] = 3.0                       # outside the span: not counted
    dens = token_density([a], [(1, 5)])
    assert dens.tolist() == [1.0, 0.25, 0.0]
    keep = np.array([True, False, True, True, True])
    assert token_density([a], [(1, 5)], [keep]).tolist() == [1.0, 0.0, 0.0]
    assert token_density([a, a], [(0, 0), (1, 5)]).tolist() == [1.0, 0.25, 0.0]   # empty spans add nothing


def test_density_filter_drops_dense_latent_with_large_difference():
    acts, spans, y = _token_acts()
    X = sample_max(acts, spans)
    dens = token_density(acts, spans)
    assert dens[0] == 1.0 and dens[5] < 0.2
    cats = ["violence" if lab else None for lab in y]
    # off (the default): the dense latent has the largest standardised difference and is selected first
    off = select_gate_features(X, y, cats, k=2)
    assert off.overall.ids[0] == 0 and off.categories["violence"].ids[0] == 0
    # a cutoff below its density excludes it from every set; the sparse latent takes its place
    allowed = dens <= 0.5
    on = select_gate_features(X, y, cats, k=2, allowed=allowed)
    assert 0 not in on.all_ids() and on.overall.ids[0] == 5
    # the other latents keep exactly their scores (no re-standardisation over the survivors)
    s = diff_scores(X, y)
    assert on.overall.weights[0] == pytest.approx(float(s[5]))
    # a cutoff above its density keeps it
    assert select_gate_features(X, y, cats, k=2, allowed=dens <= 1.0).overall.ids == off.overall.ids


def test_norm_filter_is_causal_and_drops_position_zero():
    norms = np.array([500.0, 1.0, 1.2, 0.9, 1.1, 1.0, 30.0, 1.1])
    m = causal_norm_mask(norms)
    assert m.tolist() == [False, True, True, True, True, True, False, True]
    # appending future tokens never changes earlier decisions (the reference's full-sequence median would)
    m2 = causal_norm_mask(np.concatenate([norms, [1000.0] * 20]))
    assert m2[:8].tolist() == m.tolist()
    f = CausalNormFilter()
    assert [f.step(x) for x in norms] == m.tolist()


def test_aggregation_modes():
    c = np.array([0.0, 2.0, 0.0, 2.0, 2.0, 0.0])
    assert first_cut(aggregate(c, "max"), 1.0) == 1
    assert first_cut(aggregate(c, "debounce"), 1.0) == 4
    g = aggregate(c, "decay")
    assert g[3] == pytest.approx(2.0 + 0.25 * 2.0)
    assert g[4] == pytest.approx(2.0 + 0.5 * 2.0 + 0.125 * 2.0)
    long = np.ones(30)
    assert aggregate(long, "decay")[-1] == pytest.approx(sum(0.5 ** i for i in range(10)))
    with pytest.raises(ValueError, match="Did you mean 'decay'"):
        aggregate(c, "decya")


def _scorer(mode="max"):
    ov = FeatureSet(ids=[4, 1], weights=[1.0, 0.5])
    cats = {"violence": FeatureSet(ids=[4], weights=[1.0], category="violence"),
            "sexual": FeatureSet(ids=[2], weights=[1.0], category="sexual")}
    return GateScorer(GateFeatures(ov, cats), columns=[1, 2, 4], threshold=1.5,
                      category_thresholds={"violence": 1.0, "sexual": 1.0}, mode=mode)


@pytest.mark.parametrize("mode", ["max", "debounce", "decay"])
def test_stream_scorer_equals_offline(mode):
    rng = np.random.default_rng(3)
    T = 40
    acts = rng.exponential(0.4, size=(T, 3))
    norms = rng.uniform(1, 2, size=T)
    norms[0] = 400.0
    norms[17] = 300.0
    sc = _scorer(mode)
    span = (6, T)
    off = score_sequence(sc, acts, norms, span)
    st = StreamScorer(sc)
    st.context(norms[:6])
    cs, gs, cut = [], [], None
    for t in range(6, T):
        c, g, now = st.step(acts[t], norms[t])
        cs.append(c)
        gs.append(g)
        if now and cut is None:
            cut = t - 6
    np.testing.assert_allclose(cs, off.c, rtol=1e-12)
    np.testing.assert_allclose(gs, off.g, rtol=1e-12)
    assert cut == off.cut
    assert off.c[17 - 6] == 0.0   # the outlier token was filtered


def test_gate_scorer_category_and_features():
    sc = _scorer()
    row = np.array([0.1, 0.2, 3.0])
    assert sc.category_at(row) == "violence"
    assert sc.top_features(row)[0] == (4, 3.0)
    with pytest.raises(ValueError, match="lack selected"):
        GateScorer(sc.features, columns=[1, 2], threshold=1.0)


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


def test_thresholds_roundtrip(tmp_path):
    t = Thresholds(prompt=0.5, response=1.5, mode="debounce", prompt_categories={"x": 1.0})
    t.save(tmp_path / "t.json")
    assert Thresholds.load(tmp_path / "t.json") == t


def test_batchtopk_threshold_gives_l0_near_k():
    from guard.build import batchtopk_threshold

    sae = _rand_jumprelu(d_in=16, d_sae=64, thr=0.0)
    x = torch.randn(4096, 16)
    thr = batchtopk_threshold(sae, x, k=4.0, batch=512)
    with torch.no_grad():
        sae.threshold.fill_(thr)
        l0 = float((sae.encode(x) > 0).sum(-1).float().mean())
    assert 3.0 < l0 < 5.0
