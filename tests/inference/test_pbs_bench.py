"""Benchmark plumbing on small synthetic tensors (the real run needs SmolLM2 and minutes of CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.pbs_attn.bench import (
    TAUS,
    _curve,
    _mean_curves,
    choose_head_thresholds,
    choose_layer_threshold,
    op_row,
    plot,
)
from inference.pbs_attn.config import PBSSettings
from inference.pbs_attn.synthetic import heavy_hitter_qkv


def test_op_row_times_both_paths_and_reports_plan_quality(tmp_path: Path) -> None:
    settings = PBSSettings(attention="pbs", min_len=0)
    qkv = {0: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=1), 3: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=2)}
    row = op_row(1025, qkv, settings, reps=1)
    assert row["layers"] == [0, 3]
    assert row["dense_sdpa_s"] > 0 and row["pbs_s"] > row["pbs_plan_s"] > 0
    assert 0.0 < row["density"] < 1.0 and 0.9 < row["recall"] <= 1.0
    # the speedup is the ratio of the two reported times, reported to 3 decimals; the times are rounded to
    # 1 µs for the report, so recomputing it from them agrees to half the speedup's last digit plus that
    # rounding (a few-ms op at this size)
    assert row["speedup_vs_sdpa"] == pytest.approx(row["dense_sdpa_s"] / row["pbs_s"], rel=5e-3, abs=5e-4)

    q, k, _ = qkv[0]
    curve = _mean_curves([_curve(q, k, settings)])
    assert set(curve) == {"perm", "no_perm"}
    dens = curve["perm"]["density"]
    assert curve["perm"]["tau"] == list(TAUS) and dens == sorted(dens)  # higher τ never selects fewer blocks
    report = {
        "op": [row],
        "curves": {"len": 1025, "smollm2_mean_over_layers": curve, "synthetic_heavy_hitter": curve},
    }
    plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    json.dumps(report)  # the report must stay JSON-serialisable


def test_op_row_opted_out_layer_is_timed_dense_with_full_recall() -> None:
    settings = PBSSettings(attention="pbs", min_len=0, dense_layers=(3,))
    qkv = {0: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=1), 3: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=2)}
    row = op_row(1025, qkv, settings, reps=1)
    assert row["dense_layers"] == [3]
    assert row["per_layer"][3]["path"].startswith("dense") and row["per_layer"][0]["path"] == "pbs tau=0.9"
    assert row["per_layer"][3]["recall"] == 1.0 and row["per_layer"][3]["density"] == 1.0
    assert row["per_layer"][0]["recall"] < 1.0
    assert row["recall"] == pytest.approx((1.0 + row["per_layer"][0]["recall"]) / 2, abs=1e-4)


def test_calibration_picks_the_smallest_tau_reaching_the_floor() -> None:
    rec = {0.9: 0.93, 0.95: 0.948, 0.98: 0.96, 0.99: 0.97}
    dens = {0.9: 0.3, 0.95: 0.4, 0.98: 0.55, 0.99: 0.7}
    assert choose_layer_threshold(rec, dens, 0.9, 0.95) == 0.98
    assert choose_layer_threshold(rec, dens, 0.9, 0.92) == 0.9
    assert choose_layer_threshold(rec, dens, 0.9, 0.99) == 1.0  # nothing reaches it: dense
    # a candidate that computes every tile anyway is no better than dense
    assert choose_layer_threshold(rec, {**dens, 0.98: 1.0, 0.99: 1.0}, 0.9, 0.955) == 1.0


def test_per_head_calibration_raises_only_the_heads_that_lose_mass() -> None:
    # head 1 loses mass at τ 0.9; raising it alone reaches the floor at fewer tiles than raising every head
    rec = {0.9: [0.97, 0.85, 0.97], 0.98: [0.99, 0.93, 0.99], 0.99: [0.995, 0.96, 0.995]}
    dens = {0.9: [0.3, 0.3, 0.3], 0.98: [0.5, 0.5, 0.5], 0.99: [0.6, 0.6, 0.6]}
    assert choose_head_thresholds(rec, dens, 0.9, 0.95) == (0.9, 0.98, 0.9)
    assert choose_head_thresholds(rec, dens, 0.9, 0.96) == (0.9, 0.99, 0.9)
    assert choose_head_thresholds(rec, dens, 0.9, 0.90) == 0.9  # floor met: the global τ, as a scalar
    # all heads raised to the same τ collapse to a scalar; an unreachable floor means dense
    assert choose_head_thresholds(rec, dens, 0.9, 0.983) == 0.99
    assert choose_head_thresholds(rec, dens, 0.9, 0.999) == 1.0
    # per extra tile: a cheap head with a small gain beats an expensive head with a larger one
    rec2 = {0.9: [0.90, 0.90], 0.98: [0.95, 0.97]}
    dens2 = {0.9: [0.2, 0.2], 0.98: [0.25, 0.9]}
    assert choose_head_thresholds(rec2, dens2, 0.9, 0.92) == (0.98, 0.9)


def test_op_row_runs_a_per_head_tau() -> None:
    qkv = {2: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=3)}
    s = PBSSettings(attention="pbs", min_len=0, threshold=0.5, layer_thresholds={2: (0.5, 0.5, 0.99, 1.0)})
    row = op_row(1025, qkv, s, reps=1)
    assert row["per_layer"][2]["path"] == "pbs tau=(0.5, 0.5, 0.99, 1.0)"
    low = op_row(1025, qkv, s.model_copy(update={"layer_thresholds": {}}), reps=1)
    assert row["recall"] > low["recall"] and row["density"] > low["density"]


def test_op_row_uses_the_layer_tau_override() -> None:
    base = PBSSettings(attention="pbs", min_len=0, threshold=0.5)
    qkv = {2: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=3)}
    low = op_row(1025, qkv, base, reps=1)
    high = op_row(1025, qkv, base.model_copy(update={"layer_thresholds": {2: 0.99}}), reps=1)
    assert high["per_layer"][2]["path"] == "pbs tau=0.99" and low["per_layer"][2]["path"] == "pbs tau=0.5"
    assert high["recall"] > low["recall"] and high["density"] > low["density"]


def test_op_row_uses_the_length_bucket_of_its_length() -> None:
    qkv = {2: heavy_hitter_qkv(1, 4, 2, 1025, 64, seed=3)}
    s = PBSSettings(attention="pbs", min_len=0, threshold=0.5, length_thresholds={1024: {2: 0.99}, 4096: {2: 1.0}})
    row = op_row(1025, qkv, s, reps=1)
    assert row["per_layer"][2]["path"] == "pbs tau=0.99"
    dense = op_row(1025, qkv, s.model_copy(update={"length_thresholds": {1000: {2: 1.0}}}), reps=1)
    assert dense["dense_layers"] == [2] and dense["recall"] == 1.0
