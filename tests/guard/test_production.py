"""Production pairings load through the same build and serving code (small local files of the same formats)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from guard.api import GuardPolicy, SafetyCut
from guard.production import PRODUCTION, get, load_sae_source
from guard.text import user
from inference.types import TokenDelta
from tests.guard.conftest import tiny_tokenizer


def _save_tiny(kind: str, path, vocab: int):
    from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, Qwen3Config

    torch.manual_seed(0)
    kw = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
          "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512}
    cfg = {"qwen3": lambda: Qwen3Config(head_dim=16, **kw), "llama": lambda: LlamaConfig(**kw),
           "gemma2": lambda: Gemma2Config(head_dim=16, **kw)}[kind]()
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)


def _dictionary_learning_ckpt(path, d_in=32, d_sae=96):
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    torch.save({"encoder.weight": torch.randn(d_sae, d_in, generator=g) / 4, "encoder.bias": torch.zeros(d_sae),
                "decoder.weight": torch.randn(d_in, d_sae, generator=g) / 4, "b_dec": torch.zeros(d_in),
                "threshold": torch.tensor(0.05), "k": torch.tensor(8)}, path / "ae.pt")


def _sae_lens_dir(path, d_in=32, d_sae=96):
    from guard.sae import jumprelu_from_weights, save_sae

    g = torch.Generator().manual_seed(2)
    sae = jumprelu_from_weights(torch.randn(d_in, d_sae, generator=g) / 4, torch.zeros(d_sae),
                                torch.randn(d_sae, d_in, generator=g) / 4, torch.zeros(d_in), 0.05)
    save_sae(sae, path)


def test_registry_is_explicit_and_loud():
    assert set(PRODUCTION) == {"qwen3guard-8b", "shieldgemma-2b", "llama-guard-3-8b"}
    assert get("qwen3guard-8b").layer == 18
    with pytest.raises(KeyError, match="Did you mean 'shieldgemma-2b'"):
        get("shieldgema-2b")
    with pytest.raises(ValueError, match="Available"):
        load_sae_source("bogus:/x")


@pytest.mark.parametrize("kind,sae_kind", [("qwen3", "dictionary_learning"), ("gemma2", "sae_lens"),
                                           ("llama", "sae_lens")])
def test_pretrained_guard_builds_and_serves(tmp_path, kind, sae_kind):
    from guard.config import GuardSettings
    from guard.recipe import build
    from guard.service import NextGuard

    vocab = len(tiny_tokenizer())
    _save_tiny(kind, tmp_path / "model", vocab)
    if sae_kind == "dictionary_learning":
        _dictionary_learning_ckpt(tmp_path / "sae")
    else:
        _sae_lens_dir(tmp_path / "sae")
    art = tmp_path / "art"
    from dataclasses import replace

    from guard.recipe.pipeline import SMOKE

    prov = build(art, base_model=tmp_path / "model", preset="smoke", work_dir=tmp_path / "work",
                 overrides={"sae_source": f"{sae_kind}:{tmp_path / 'sae'}", "threads": 1,
                            "safeguard": replace(SMOKE.safeguard, max_steps=0), "sae": replace(SMOKE.sae, layers=(1,))})
    assert tuple(prov["config"]["monitored"]) == ("base",) and prov["safeguard"] == {"skipped": True}
    assert prov["layer"] == 1
    assert (art / "manifest.json").is_file() and not (art / "lora").exists()
    g = NextGuard(GuardSettings(artifacts_dir=art, monitored="base")).load()

    async def go():
        r = await g.score_text(user("hello"), "the sky is blue")
        assert len(r["tokens"]) == len(r["scores"]) > 0
        ids = g.tokenizer(" the weather is nice", add_special_tokens=False)["input_ids"]

        async def deltas():
            for k, i in enumerate(ids):
                yield TokenDelta("r", 0, [i], g.tokenizer.decode([i]),
                                 finish_reason="stop" if k == len(ids) - 1 else None)
        # threshold far above any score: the whole stream passes, every token scored
        out = [x async for x in g.watch(user("hi"), deltas(), GuardPolicy(response_threshold=1e9))]
        assert not any(isinstance(x, SafetyCut) for x in out)
        assert sum(len(x.token_ids) for x in out) == len(ids)
        # threshold below every score: cut at the first generated token, nothing released
        out = [x async for x in g.watch(user("hi"), deltas(), GuardPolicy(response_threshold=-1e9))]
        assert len(out) == 1 and isinstance(out[0], SafetyCut) and out[0].token_offset == 0
        await g.aclose()

    asyncio.run(go())
