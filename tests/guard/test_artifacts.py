"""The committed build in guard/artifacts: complete, small, self-consistent; the slow test re-measures
the SAE on fresh text and checks the numbers the provenance records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

ART = Path(__file__).resolve().parents[2] / "guard" / "artifacts"
pytestmark = pytest.mark.skipif(not (ART / "manifest.json").is_file(), reason="no committed guard artifacts")


def _prov():
    return json.loads((ART / "provenance.json").read_text())


def test_complete_and_small():
    man = json.loads((ART / "manifest.json").read_text())
    assert man["base_model"] == "embedded" and man["adapter"] == "lora" and man["layer"] == 15
    for name in man["monitors"]:
        for f in ("features.json", "thresholds.json", "selected_encoder.safetensors", "selected_encoder.json"):
            assert (ART / "monitors" / name / f).is_file()
    total = sum(p.stat().st_size for p in ART.rglob("*") if p.is_file())
    assert total < 30 * 2**20, f"artifacts are {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("name", ["lora", "base"])
def test_monitor_is_consistent(name):
    from guard.bundle import MonitorSpec

    spec = MonitorSpec.load(ART / "monitors" / name, name)
    cfg = _prov()["config"]
    for gate in ("prompt", "response"):
        gf = spec.gates[gate]
        assert 0 < len(gf.overall.ids) <= cfg["top_k"]
        assert all(w > 0 for w in gf.overall.weights)
        assert set(gf.all_ids()) <= set(spec.encoder.ids)
        thr = spec.thresholds.prompt if gate == "prompt" else spec.thresholds.response
        assert np.isfinite(thr)
        spec.scorer(gate)                     # builds: every selected latent has an encoder column
    assert spec.encoder.W.shape == (576, len(spec.encoder.ids))


def test_committed_selection_uses_the_density_filter():
    """The committed monitors were selected with the BuildConfig default cutoff (label-free, select split)."""
    from guard.build import CPU

    prov = _prov()
    assert prov["config"]["max_token_density"] == CPU.max_token_density < 1.0
    for m in prov["monitors"].values():
        for gate in ("prompt", "response"):
            df = m[gate]["density_filter"]
            assert df["max_token_density"] == CPU.max_token_density and df["dense_dropped"] > 0
            assert df["selected_density_max"] <= CPU.max_token_density


def test_selected_columns_match_the_full_sae():
    from guard.bundle import MonitorSpec
    from guard.sae import load_sae

    sae = load_sae(ART / "sae")                # stored in bf16, so compare with a bf16 tolerance
    spec = MonitorSpec.load(ART / "monitors" / "lora", "lora")
    torch.testing.assert_close(sae.W_enc.detach()[:, spec.encoder.ids], spec.encoder.W, atol=2e-2, rtol=1e-2)
    assert float(sae.threshold.detach().std()) == 0.0      # one threshold for every latent (BatchTopK -> JumpReLU)


def test_recorded_sae_quality():
    """The committed SAE is trained, not just initialised: the provenance records thousands of samples per
    latent, L0 near k, few dead latents and a held-out variance explained well above the first build's 0.26."""
    prov = _prov()
    sae, cfg = prov["sae"], prov["config"]
    assert sae["train_steps"] >= 1000 and sae["train_tokens"] == sae["train_steps"] * cfg["sae_batch"]
    held = sae["heldout_test_split"]
    assert held["variance_explained"] > 0.78 and sae["variance_explained"] > 0.78
    assert held["dead_fraction"] < 0.1 and sae["dead_fraction"] < 0.1
    assert abs(held["l0"] - cfg["sae_k"]) < 0.25 * cfg["sae_k"]
    first = prov["sae_history"][0]["sae"]            # the undertrained SAE it replaced, kept for the record
    assert first["heldout_test_split"]["variance_explained"] < held["variance_explained"]


@pytest.mark.slow
def test_sae_metrics_reproduce_on_held_out_text():
    """Variance explained, L0 and dead latents re-measured on the held-out test split (build format; never in
    the SAE's training text, selection or calibration) reproduce the recorded held-out numbers, with the same
    code the build records them with."""
    from guard.build import _load_build, heldout_sae_metrics
    from guard.runner import load_guard_model, make_runner
    from guard.sae import load_sae
    from inference.embedded import ensure_embedded_model

    torch.set_num_threads(1)
    _, cfg, bd = _load_build(ART)                   # every split hash-checked against the provenance
    model, tok = load_guard_model(ensure_embedded_model())
    m = heldout_sae_metrics(load_sae(ART / "sae"), make_runner(model, cfg.layer, max_slots=16, max_len=8192), tok,
                            bd, cfg)
    rec = _prov()["sae"]["heldout_test_split"]
    assert m["n_tokens"] == rec["n_tokens"]
    assert abs(m["variance_explained"] - rec["variance_explained"]) < 0.01
    assert abs(m["l0"] - rec["l0"]) < 0.05 * rec["l0"]
    assert m["variance_explained"] > 0.78 and m["dead_fraction"] < 0.1
