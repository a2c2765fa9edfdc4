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


def test_selected_columns_match_the_full_sae():
    from guard.bundle import MonitorSpec
    from guard.sae import load_sae

    sae = load_sae(ART / "sae")                # stored in bf16, so compare with a bf16 tolerance
    spec = MonitorSpec.load(ART / "monitors" / "lora", "lora")
    torch.testing.assert_close(sae.W_enc.detach()[:, spec.encoder.ids], spec.encoder.W, atol=2e-2, rtol=1e-2)
    assert float(sae.threshold.detach().std()) == 0.0      # one threshold for every latent (BatchTopK -> JumpReLU)


@pytest.mark.slow
def test_sae_metrics_reproduce_on_fresh_text():
    """Variance explained and L0 re-measured on chat-formatted text in the build's format (these exact
    strings are not in the SAE training text) agree with the recorded build metrics."""
    from guard.data import BENIGN_TOPICS
    from guard.runner import collect_residuals, load_guard_model, make_runner
    from guard.sae import load_sae, sae_metrics
    from inference.embedded import ensure_embedded_model

    torch.set_num_threads(1)
    model, tok = load_guard_model(ensure_embedded_model())
    r = make_runner(model, 15, max_slots=8)
    texts = [f"User: Tell me about {t}.\nAssistant: Sure. Here is an overview of {t}, step by step." for t in BENIGN_TOPICS]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    res = collect_residuals(r, ids, batch_size=8)
    acts = torch.cat([x[1:] for x in res])                 # drop position 0, as in training
    m = sae_metrics(load_sae(ART / "sae"), acts)
    rec = _prov()["sae"]
    assert m["variance_explained"] > rec["variance_explained"] - 0.15
    assert 0.5 * rec["l0"] < m["l0"] < 2.0 * rec["l0"]
