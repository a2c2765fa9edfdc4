"""The committed build in guard/artifacts: complete, small, self-consistent, calibrated under its budget; the
slow test re-measures the SAE on the held-out test split and checks the numbers the provenance records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ART = Path(__file__).resolve().parents[2] / "guard" / "artifacts"
pytestmark = pytest.mark.skipif(not (ART / "manifest.json").is_file(), reason="no committed guard artifacts")
D_MODEL = 576          # SmolLM2-135M, the embedded model the committed build monitors


def _prov() -> dict:
    return json.loads((ART / "provenance.json").read_text())


def test_complete_small_and_in_the_served_format() -> None:
    from guard.bundle import TEXT_FORMAT, read_manifest

    man = read_manifest(ART)
    assert man["text_format"] == TEXT_FORMAT and man["base_model"] == "embedded" and man["adapter"] == "lora"
    assert "lora" in man["monitors"] and set(man["monitors"]) <= {"lora", "base"} and man["layer"] == _prov()["layer"]
    for name in man["monitors"]:
        for f in ("heads.json", "selected_encoder.safetensors"):
            assert (ART / "monitors" / name / f).is_file()
    for f in ("data.jsonl.gz", "provenance.json", "sae/cfg.json", "lora/adapter_config.json"):
        assert (ART / f).is_file(), f
    total = sum(p.stat().st_size for p in ART.rglob("*") if p.is_file())
    assert total < 40 * 2**20, f"artifacts are {total / 2**20:.1f} MiB"


@pytest.mark.parametrize("name", ["lora", "base"])
def test_monitor_is_sparse_and_calibrated_under_the_budget(name: str) -> None:
    from guard.bundle import MonitorSpec, read_manifest

    if name not in read_manifest(ART)["monitors"]:
        pytest.skip(f"the committed build has no {name} monitor")
    spec = MonitorSpec.load(ART / "monitors" / name, name)
    cfg = _prov()["config"]
    assert spec.encoder.W.shape[0] == D_MODEL
    for gate, budget in (("prompt", cfg["budget_prompt"]), ("response", cfg["budget_response"])):
        g = spec.gates[gate]
        assert 0 < len(g.overall.ids) <= cfg["head"]["max_latents"]
        assert set(g.all_ids()) <= set(spec.encoder.ids)
        assert np.isfinite(g.threshold)
        # the default threshold is the one the budget buys on the calibration split's benign traffic
        assert g.threshold == pytest.approx(g.threshold_for_budget(budget))
        benign = np.asarray(g.benign_scores)
        assert len(benign) >= 200 and float((benign > g.threshold).mean()) <= budget
        # a gate that flags at random would catch the budget's share of unsafe samples; this one must do
        # clearly better at the same false-positive rate
        recall = g.calibration["calib"]["recall"]
        assert 2 * budget < recall <= 1.0
        spec.scorer(gate)                     # builds: every read-out latent has an encoder column


def test_recorded_sae_quality() -> None:
    """The committed SAE was trained on one pass of its recorded text (every training sample a distinct
    token), is 8x wide, and reconstructs held-out text far better than an untrained SAE (which explains
    nothing). The committed CPU build is small (guard/README.md says by how much it falls short of the
    recipe's targets); these bounds pin it so a rebuild cannot silently get worse."""
    prov = _prov()
    sae, layer = prov["sae"], str(prov["layer"])
    assert sae["train_samples"] <= sae["chunk_tokens"] and sae["train_samples"] >= 0.9 * prov["config"]["sae"]["tokens"]
    assert prov["config"]["sae"]["width"] >= 8 * D_MODEL
    held = sae["heldout_test_split"][layer]
    assert held["variance_explained"] >= 0.65 and held["dead_fraction"] < 0.8
    k = prov["config"]["sae"]["k"]
    assert abs(held["l0"] - k) < 0.35 * k
    assert str(prov["layer"]) in sae["per_layer"]


def test_safeguard_was_trained_to_a_validation_stop() -> None:
    sg = _prov()["safeguard"]
    assert sg["steps_run"] >= 40 and sg["best_val_loss"] < sg["history"][0]["val_loss"]
    assert sg["best_val_loss"] == min(h["val_loss"] for h in sg["history"])     # the best adapter is the one kept
    verdict = sg["posthoc_verdict"]["test/response"]["best_f1"]["f1"]
    assert 0.5 < verdict <= 1.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sae_metrics_reproduce_on_held_out_text() -> None:
    """Variance explained and L0 re-measured on the held-out test split (never in the SAE's training text,
    selection or calibration) with the build's own code reproduce the recorded numbers."""
    import torch

    from guard.bundle import load_model_for
    from guard.evaluate import load_build_data
    from guard.recipe.pipeline import PRESETS, heldout_metrics
    from guard.sae import load_sae

    torch.set_num_threads(2)
    prov = _prov()
    layer = prov["layer"]
    model, tok = load_model_for(ART, "lora")[:2]
    test = load_build_data(ART)["test"]
    m = heldout_metrics(model, tok, {layer: load_sae(ART / "sae")}, test, PRESETS[prov["preset"]])[str(layer)]
    rec = prov["sae"]["heldout_test_split"][str(layer)]
    # the committed SAE is stored in bf16, so allow a little drift from the fp32 numbers recorded at build time
    assert abs(m["variance_explained"] - rec["variance_explained"]) < 0.02
    assert abs(m["l0"] - rec["l0"]) < 0.1 * rec["l0"]
    assert m["variance_explained"] >= 0.65
