"""PBS-Attn integration: settings, transformers AttentionInterface, vLLM plugin selection logic (CPU)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from inference.pbs_attn.config import PBSSettings


def test_settings_defaults_and_validation() -> None:
    s = PBSSettings()
    assert (s.attention, s.threshold, s.segment_size, s.block_size, s.min_len) == (
        "dense",
        0.9,
        256,
        128,
        16384,
    )
    assert not s.enabled and PBSSettings(attention="pbs").enabled
    with pytest.raises(ValidationError, match="multiple of block_size"):
        PBSSettings(segment_size=200)
    with pytest.raises(ValidationError):
        PBSSettings(threshold=0.0)
    with pytest.raises(ValidationError):
        PBSSettings(attention="sparse")  # type: ignore[arg-type]


def _tiny_llama(attn: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_hf_pbs_dense_equivalence_and_prefill_only() -> None:
    from inference.pbs_attn.hf import register_hf_attention, stats

    name = register_hf_attention(
        PBSSettings(attention="pbs", threshold=0.999999, min_len=0), name="pbs_test_all"
    )
    dense_model = _tiny_llama("sdpa")
    pbs_model = _tiny_llama(name)
    ids = torch.randint(0, 128, (1, 700))
    stats.reset()
    with torch.no_grad():
        dense = dense_model(ids).logits
        sparse = pbs_model(ids).logits
    assert stats.pbs == 2 and stats.dense == 0  # both layers' prefill went through PBS
    torch.testing.assert_close(sparse, dense, atol=1e-4, rtol=1e-4)
    stats.reset()
    with torch.no_grad():
        out = pbs_model.generate(ids, max_new_tokens=3, do_sample=False)
        ref = dense_model.generate(ids, max_new_tokens=3, do_sample=False)
    assert stats.pbs == 2  # prefill only
    assert stats.dense == 2 * 2  # two decode steps x two layers stay on SDPA
    assert torch.equal(out, ref)


def test_hf_length_gate_and_padding_fall_back_to_sdpa() -> None:
    from inference.pbs_attn.hf import register_hf_attention, stats

    name = register_hf_attention(PBSSettings(attention="pbs", min_len=1000), name="pbs_test_gate")
    model = _tiny_llama(name)
    stats.reset()
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 700)))
    assert (stats.pbs, stats.dense) == (0, 2)
    stats.reset()
    mask = torch.ones(2, 1100, dtype=torch.long)
    mask[1, :5] = 0  # left padding -> a real mask -> SDPA
    with torch.no_grad():
        model(torch.randint(0, 128, (2, 1100)), attention_mask=mask)
    assert (stats.pbs, stats.dense) == (0, 2)


def test_hf_registration_is_loud_about_conflicts() -> None:
    from inference.pbs_attn.hf import register_hf_attention

    s = PBSSettings(attention="pbs", threshold=0.8)
    assert register_hf_attention(s, name="pbs_test_dup") == "pbs_test_dup"
    assert register_hf_attention(s, name="pbs_test_dup") == "pbs_test_dup"  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_hf_attention(PBSSettings(attention="pbs", threshold=0.7), name="pbs_test_dup")
    with pytest.raises(ValueError, match="transformers attention implementation"):
        register_hf_attention(s, name="sdpa")
