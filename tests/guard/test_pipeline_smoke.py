"""The whole recipe end to end on a tiny model: build -> eval -> bench, through the real code paths."""

from __future__ import annotations

import json

import pytest

from tests.guard.conftest import tiny_tokenizer
from tests.guard.test_production import _save_tiny


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from guard.build import build

    d = tmp_path_factory.mktemp("pipe")
    _save_tiny("llama", d / "model", len(tiny_tokenizer()))
    prov = build(d / "art", base_model=d / "model", preset="smoke", overrides={"layer": 1, "n_generated": 6, "max_tokens_per_sample": 400})
    return d, prov


def test_build_outputs(built):
    d, prov = built
    art = d / "art"
    for f in ("manifest.json", "provenance.json", "sae/cfg.json", "lora/adapter_config.json",
              "monitors/lora/features.json", "monitors/base/thresholds.json", "generated_benign.jsonl"):
        assert (art / f).is_file(), f
    assert prov["sae"]["architecture_saved"] == "jumprelu"
    assert 0 < prov["sae"]["l0"] <= prov["config"]["sae_width"]
    for split in ("select", "calib", "test"):
        assert len(prov["data"]["splits"][split]["sha256"]) == 64
    feats = json.loads((art / "monitors/lora/features.json").read_text())
    assert 0 < len(feats["prompt"]["overall"]["ids"]) <= prov["config"]["top_k"]
    assert all(w > 0 for w in feats["response"]["overall"]["weights"])


def test_eval_and_bench_run(built, tmp_path):
    from guard.bench import run_bench
    from guard.evaluate import run_eval

    d, _ = built
    rep = run_eval(d / "art", tmp_path / "ev", base_model=str(d / "model"), limit=8, posthoc_stream_n=2)
    assert rep["n"]["constructed_streams"] > 0
    for name in ("nextguard-lora", "nextguard-base", "probe", "posthoc", "profanity"):
        assert name in rep["summary"]
    st = rep["monitors"]["lora"]["streaming"]["max"]
    assert 0.0 <= st["cut_within_unsafe_span"] <= st["cut_rate"] + 1e-9
    assert {"within_16", "within_32", "within_128", "tokens_leaked_mean", "false_cut_rate_benign"} <= set(st)
    ops = rep["monitors"]["lora"]["operating_points"]
    for gate in ("prompt", "response"):
        budgets = [o["max_calibration_fpr"] for o in ops[gate]]
        assert budgets == sorted(budgets)
        # a larger false-positive budget never raises the threshold (the calibration picks it)
        thr = [o["threshold"] for o in ops[gate]]
        assert thr == sorted(thr, reverse=True)
    assert {"stream_cut_in_span", "test_flagged_safe"} <= set(ops["response"][0])
    for f in ("report.json", "pr_prompt.png", "pr_response.png", "traces_lora.png"):
        assert (tmp_path / "ev" / f).is_file()
    res = run_bench(d / "art", base_model=str(d / "model"), streams=2, tokens=4, cost_tokens=8)
    assert res["per_token"]["layers_monitor"] == 2 and res["per_token"]["layers_full"] == 3
    assert res["cost_ratio"] > 0 and res["throughput_ratio_ids"] > 0
    assert res["throughput_tok_s"]["unguarded"] > 0


def test_retrain_sae_reuses_the_lora_and_reselects(built, tmp_path):
    import hashlib
    import shutil

    from guard.build import retrain_sae

    d, prov = built
    art = tmp_path / "art"
    shutil.copytree(d / "art", art)

    def sha(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    lora_before = {p.name: sha(p) for p in (art / "lora").iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="only changes SAE settings"):
        retrain_sae(art, base_model=d / "model", overrides={"lora_steps": 5})
    new = retrain_sae(art, base_model=d / "model", overrides={"sae_tokens": 2048, "sae_lr": 1e-3},
                      cache_dir=tmp_path / "cache")
    assert {p.name: sha(p) for p in (art / "lora").iterdir() if p.is_file()} == lora_before
    assert new["config"]["sae_tokens"] == 2048 and new["config"]["sae_lr"] == 1e-3
    assert new["config"]["lora_steps"] == prov["config"]["lora_steps"]
    assert new["data"]["splits"] == prov["data"]["splits"]
    hist = new["sae_history"][-1]
    assert hist["sae"]["variance_explained"] == prov["sae"]["variance_explained"]
    assert hist["config"]["sae_tokens"] == prov["config"]["sae_tokens"]
    assert new["sae"]["train_steps"] == 2048 // new["config"]["sae_batch"]
    assert "heldout_test_split" in new["sae"] and new["sae_retrained"]["lora_reused"]
    assert set(new["monitors"]) == {"lora", "base"}
    assert json.loads((art / "manifest.json").read_text())["adapter"] == "lora"
    # a rerun takes the activations from the cache
    again = retrain_sae(art, base_model=d / "model", overrides={"sae_tokens": 2048}, cache_dir=tmp_path / "cache")
    assert again["sae"]["activations_from_cache"] and len(again["sae_history"]) == 2
    # selection settings only: same SAE file, monitors reselected with latent-scaled weights
    from guard.build import reselect_monitors

    sae_sha = sha(art / "sae" / "sae_weights.safetensors")
    with pytest.raises(ValueError, match="only changes selection settings"):
        reselect_monitors(art, base_model=d / "model", overrides={"sae_lr": 1.0})
    rs = reselect_monitors(art, base_model=d / "model", overrides={"weight_scale": "std", "max_token_density": 0.3})
    assert sha(art / "sae" / "sae_weights.safetensors") == sae_sha
    assert rs["config"]["weight_scale"] == "std" and rs["selection_history"][-1]["config"]["weight_scale"] == "none"
    assert rs["config"]["max_token_density"] == 0.3
    for m in rs["monitors"].values():
        for g in ("prompt", "response"):
            df = m[g]["density_filter"]
            assert df["max_token_density"] == 0.3 and df["dense_dropped"] >= 0
            assert df["selected_density_max"] <= 0.3
    feats = json.loads((art / "monitors/base/features.json").read_text())
    assert all(w > 0 for w in feats["response"]["overall"]["weights"])
