from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _nextguard(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nextguard")
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NEXTGUARD_HOME": str(home)})


def test_cli_list_and_run_prints_result_json_last(tmp_path: Path) -> None:
    ls = _nextguard("suites", "list", "--json", home=tmp_path)
    assert ls.returncode == 0, ls.stderr
    assert {"cgm", "tableagent", "repsim", "powerlaw-cot", "fp-equivariance"} <= {s["name"] for s in json.loads(ls.stdout)}
    r = _nextguard("suites", "run", "tableagent", "--preset", "smoke", "--seed", "2",
                   "--config", '{"llm_dialogues": 0, "judge_items": 0, "dialogues": 2}', home=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert body["suite"] == "tableagent" and body["summary"]["gates_passed"] and body["provenance"]["seed"] == 2
    assert any(line.startswith("PASS sanity oracle_ic_micro_strict") for line in r.stdout.splitlines())
    out = tmp_path / "suite-results" / "local" / "tableagent-smoke-2"
    assert (out / "tableworld_manifest.json").is_file()


def test_cli_unknown_suite_fails_loudly(tmp_path: Path) -> None:
    r = _nextguard("suites", "run", "cmg", home=tmp_path)
    assert r.returncode != 0 and "Did you mean: cgm?" in r.stderr


def test_suite_engine_computes_in_fp32_unless_told_otherwise(monkeypatch) -> None:
    from inference.config import InferenceSettings
    from offline_suites.config import SuitesEnv, SuiteSettings, suite_engine_settings

    inf = InferenceSettings(dtype="auto", max_model_len=512)
    assert suite_engine_settings(inf, SuiteSettings()).dtype == "float32"
    assert suite_engine_settings(inf, SuiteSettings()).max_model_len == 512        # the rest is the engine's
    assert suite_engine_settings(inf, SuiteSettings(engine_dtype="inherit")).dtype == "auto"
    monkeypatch.setenv("NEXTGUARD_INFERENCE__DTYPE", "bfloat16")
    monkeypatch.setenv("NEXTGUARD_SUITES__ENGINE_DTYPE", "inherit")
    env = SuitesEnv()
    assert suite_engine_settings(env.inference, env.suites).dtype == "bfloat16"
