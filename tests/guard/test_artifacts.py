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
    # the LoRA (~19 MiB), the published data (~3 MiB), one bf16 SAE (~10 MiB) per candidate layer plus the
    # served copy, and each monitor (~3.2 MiB: its encoder columns, most of them the prompt probe's hidden units):
    # what a build on another machine needs to continue without retraining
    n_sae = 1 + len(list((ART / "candidates").glob("sae-L*")))
    assert total < (23 + 11 * n_sae + 3.5 * len(man["monitors"])) * 2**20, f"artifacts are {total / 2**20:.1f} MiB"


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
        # sparse: no more latents than the variant it was fitted as allowed, and that variant is one of the
        # gate's grid
        hc = g.calibration["head"]
        grid = cfg.get(f"{gate}_head_grid") or [[cfg["head"]["window"], cfg["head"]["min_count"], cfg["head"]["l1"],
                                                 cfg["head"]["max_latents"]]]
        if g.calibration.get("refit_over") == "monitor_latents":
            # the prompt read-out refitted over the latents the window-max read-outs chose: its window is one of
            # the refit grid, and the window-max variant it replaced is one of the gate's grid
            wm = g.calibration["window_max_head"]
            assert gate == "prompt" and g.overall.info["rule"].startswith("sample-mean")
            assert [hc["window"], hc["min_count"]] in [list(v) for v in cfg["prompt_refit_grid"]]
            assert [wm["window"], wm["min_count"], wm["l1"], wm["max_latents"]] in [list(v) for v in grid]
            # no more latents than the window-max read-outs of both gates (overall, categories, the paper's 32)
            # can have chosen together, and exactly the number the build refitted over
            refit = json.loads((ART / "monitors" / name / "build.json").read_text())["report"]["prompt"]["refit"]
            chosen_by = (max(v[3] for v in cfg["prompt_head_grid"]) + max(v[3] for v in cfg["response_head_grid"])
                         + cfg["category_latents"] * sum(len(spec.gates[x].categories) for x in spec.gates) + 2 * 32)
            assert 0 < len(g.overall.ids) <= hc["max_latents"] == refit["candidates"] <= chosen_by
        else:
            assert [hc["window"], hc["min_count"], hc["l1"], hc["max_latents"]] in [list(v) for v in grid]
            assert 0 < len(g.overall.ids) <= hc["max_latents"] <= cfg["sae"]["width"] // 10
        assert set(g.all_ids()) <= set(spec.encoder.ids)
        assert np.isfinite(g.threshold)
        # the default threshold is the one the budget buys on the calibration split's benign traffic
        assert g.threshold == pytest.approx(g.threshold_for_budget(budget))
        benign = np.asarray(g.benign_scores)
        assert len(benign) >= 200 and float((benign > g.threshold).mean()) <= budget
        # traffic held to the budget on its own (the generated structured prompts) is within it too
        for source, scores in g.own_budget_scores.items():
            assert len(scores) >= 100 and float((np.asarray(scores) > g.threshold).mean()) <= budget, source
        # a gate that flags at random would catch the budget's share of unsafe samples; this one must do
        # clearly better at the same false-positive rate
        recall = g.calibration["calib"]["recall"]
        assert 2 * budget < recall <= 1.0
        if g.context is not None:
            # the response gate's context term: the calibration split's choice, at the threshold it was chosen
            # with, and no worse there than the read-out alone
            ctx = g.calibration["context"]
            assert gate == "response" and ctx["chosen"]["threshold"] == g.threshold
            assert [ctx["chosen"]["weight"], ctx["chosen"]["scale"]] in [list(t) for t in cfg["response_context_grid"]]
            assert ctx["chosen"]["f1"] >= ctx["tried"][0]["f1"] and ctx["chosen"]["benign_cut"] <= budget
        if g.probe is not None and gate == "prompt":
            # the prompt gate's probe is added to the read-out's score: the threshold and benign scores checked
            # above are the sum's, and the sum does better on the calibration split than the read-out alone
            assert g.probe_weight is not None and g.probe_weight > 0 and g.probe_threshold is None
            # one encoder column per hidden unit (and one for a line beside them) where the probe has a hidden
            # layer, else one column
            cols = 1 if g.probe_hidden is None else g.probe_hidden.n_columns
            assert len(g.probe.ids) == cols and set(g.probe.ids) <= set(spec.encoder.probe_ids)
            if g.probe_hidden is not None:
                units = cfg["prompt_probe_hidden"] * g.calibration["probe"]["hidden"]["seeds"]
                assert len(g.probe_hidden.weights) == units
                assert len(g.probe_hidden.linear) == int(cfg.get("prompt_probe_linear", False))
            rec = g.calibration["probe"]
            assert rec["threshold"] == pytest.approx(g.threshold)
            assert rec["calibration"]["with_probe"]["balanced_accuracy"] > rec["calibration"]["readout_only"]["balanced_accuracy"]
            assert rec["calibration"]["with_probe"]["flagged_benign_traffic"] <= budget
            # each generated kind's share is recorded against its own part's scores and threshold
            for part, own, thr in (("readout_only", rec["readout_own_budget_scores"], rec["readout_threshold"]),
                                   ("with_probe", g.own_budget_scores, g.threshold)):
                for src, scores in own.items():
                    assert rec["calibration"][part][src.rsplit("/", 1)[-1] + "_flagged"] == pytest.approx(
                        float(np.mean(np.asarray(scores) > thr))), (part, src)
        elif g.probe is not None:
            # the residual probe: at the budget on its own benign scores, served as the encoder's probe column,
            # and the two triggers together within twice the budget on the calibration split
            assert gate == "response" and len(g.probe.ids) == 1 and g.probe.ids[0] in spec.encoder.probe_ids
            assert g.probe_threshold == pytest.approx(g.probe_threshold_for_budget(budget))
            pb = np.asarray(g.probe_benign_scores)
            assert len(pb) == len(benign) and float((pb > g.probe_threshold).mean()) <= budget
            rec = g.calibration["probe"]
            assert rec["flagged_benign_traffic"] <= 2 * budget
            assert rec["calibration"]["with_probe"]["drift_cut"] > rec["calibration"]["readout_only"]["drift_cut"]
        spec.scorer(gate)                     # builds: every read-out latent has an encoder column


def test_recorded_sae_quality() -> None:
    """Every candidate SAE was trained on 3 M token passes of the residual cache, is 8x wide, and on
    held-out text (the test split) has at most 5 % dead latents and explains at least 84 % of the variance.
    The recipe aims at 85 %; the committed layer-14 SAE measures 84.5 % (guard/README.md), so the bound pins
    what was reached: a rebuild cannot silently get worse."""
    prov = _prov()
    sae, layer = prov["sae"], str(prov["layer"])
    assert prov["config"]["sae"]["width"] >= 8 * D_MODEL
    k = prov["config"]["sae"]["k"]
    assert layer in sae["per_layer"]
    for L, rec in sae["per_layer"].items():
        # whole batches of the configured 3 M token passes (1,464 x 2,048)
        assert rec["token_passes"] > prov["config"]["sae"]["token_passes"] - prov["config"]["sae"]["batch"] >= 2_990_000, L
        held = rec["heldout_test_split"]
        assert held["variance_explained"] >= 0.84, L
        assert held["dead_fraction"] <= 0.05, L
        assert abs(held["l0"] - k) < 0.25 * k, L


@pytest.mark.parametrize("autocast", [True, False])
def test_committed_saes_are_reused_by_a_default_build_in_either_dtype(autocast: bool) -> None:
    """The committed SAEs' keys name the data and adapter they were trained on, whether the machine computes in
    bf16 or fp32: a build on those rows reuses them instead of retraining for an hour. Where a response-gate
    refit replaced the answers since (its record keeps the previous rows' hashes), the SAEs' keys name those
    previous rows, and a default build on the current data trains new ones."""
    from dataclasses import replace

    from guard.recipe import data as DATA
    from guard.recipe.pipeline import BuildConfig, monitored_id, sae_inputs_key
    from guard.recipe.sources import data_hash

    cfg = BuildConfig()
    prov = _prov()
    ds = DATA.load_dataset(ART / "data.jsonl.gz")
    current = {k: data_hash(ds.splits[k]) for k in ("select", "calib")}
    assert current == {k: prov["data"]["splits"][k]["sha256"] for k in current}
    changes = [r["data"]["previous_splits"] for r in prov.get("response_gate_refits", []) if "data" in r]
    trained_on = changes[0] if changes else current

    def key(sae_cfg, rows):
        return sae_inputs_key(sae_cfg, monitored_id("embedded", ART / "lora"), rows["select"], rows["calib"],
                              cfg.max_tokens)

    k = key(replace(cfg.sae, autocast=autocast, threads=1), trained_on)
    for layer in cfg.sae.layers:
        assert json.loads((ART / "candidates" / f"sae-L{layer}" / "train.json").read_text())["key"] == k, layer
    assert k != key(replace(cfg.sae, k=cfg.sae.k + 1), trained_on)
    if changes:
        assert key(cfg.sae, current) != key(cfg.sae, trained_on)


def test_safeguard_was_trained_to_a_validation_stop() -> None:
    sg = _prov()["safeguard"]
    assert sg["steps_run"] >= 40 and sg["best_val_loss"] < sg["history"][0]["val_loss"]
    assert sg["best_val_loss"] == min(h["val_loss"] for h in sg["history"])     # the best adapter is the one kept
    verdict = sg["posthoc_verdict"]["test/response"]["best_f1"]["f1"]
    assert 0.5 < verdict <= 1.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sae_metrics_reproduce_on_held_out_text(tmp_path: Path) -> None:
    """Variance explained and L0 re-measured on held-out text (test-split samples, never in the SAE's
    training rows, selection or calibration) with the build's own code reproduce the recorded numbers."""
    import torch

    from guard.bundle import load_model_for, read_manifest
    from guard.evaluate import load_build_data
    from guard.hardware import build_dtype
    from guard.recipe.cache import bits_to_float, build_cache
    from guard.recipe.sae import training_rows
    from guard.sae import load_sae, sae_metrics

    torch.set_num_threads(2)
    prov = _prov()
    layer = prov["layer"]
    dtype = build_dtype(read_manifest(ART)["dtype"])
    model, tok = load_model_for(ART, "lora", dtype=dtype)[:2]
    test = load_build_data(ART)["test"]
    rng = np.random.default_rng(0)
    sub = [test[i] for i in sorted(rng.choice(len(test), 300, replace=False))]
    cache = build_cache(model, tok, sub, [layer], tmp_path / "cache", model_id="test", max_tokens=prov["config"]["max_tokens"],
                        dtype=dtype)
    rows = training_rows(cache, layer, list(range(len(sub))), [s.response is not None for s in sub])
    m = sae_metrics(load_sae(ART / "sae"), bits_to_float(np.asarray(cache.array(layer)[rows])))
    rec = prov["sae"]["heldout_test_split"][str(layer)]
    # another sample of the same split, and the stored SAE is bf16: a little drift from the recorded numbers
    assert abs(m["variance_explained"] - rec["variance_explained"]) < 0.03
    assert abs(m["l0"] - rec["l0"]) < 0.1 * rec["l0"]
    assert m["variance_explained"] >= 0.84
