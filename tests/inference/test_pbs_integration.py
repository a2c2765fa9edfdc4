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


def test_dense_layers_setting_parses_env_text_and_rejects_bad_indices() -> None:
    assert PBSSettings(dense_layers="3,4").dense_layers == (3, 4)  # type: ignore[arg-type]
    assert PBSSettings(dense_layers="[0, 5]").dense_layers == (0, 5)  # type: ignore[arg-type]
    s = PBSSettings(attention="pbs", dense_layers=(2,))
    assert s.layer_enabled(1) and not s.layer_enabled(2) and s.layer_enabled(None)
    assert not PBSSettings(attention="dense").layer_enabled(1)
    with pytest.raises(ValidationError, match="dense_layers"):
        PBSSettings(dense_layers=(-1,))
    with pytest.raises(ValidationError):
        PBSSettings(dense_layers="3,x")  # type: ignore[arg-type]


def test_layer_thresholds_override_the_global_tau() -> None:
    s = PBSSettings(attention="pbs", threshold=0.9, dense_layers=(1,), layer_thresholds="4:0.98, 5:1.0")  # type: ignore[arg-type]
    assert s.layer_thresholds == {4: 0.98, 5: 1.0}
    assert [s.threshold_for(i) for i in (0, 1, 4, 5, None)] == [0.9, 1.0, 0.98, 1.0, 0.9]
    assert s.layer_enabled(4) and not s.layer_enabled(5) and not s.layer_enabled(1)
    assert PBSSettings(layer_thresholds='{"2": 0.95}').layer_thresholds == {2: 0.95}  # type: ignore[arg-type]
    for bad in ({3: 0.0}, {3: 1.5}, {-1: 0.9}):
        with pytest.raises(ValidationError, match="layer_thresholds"):
            PBSSettings(layer_thresholds=bad)


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



def _paths(model: torch.nn.Module, n: int, batch: int = 1, attention_mask: torch.Tensor | None = None) -> tuple[int, int]:
    """(PBS calls, SDPA calls) of one forward over ``batch`` x ``n`` random tokens."""
    from inference.pbs_attn.hf import stats

    stats.reset()
    with torch.no_grad():
        model(torch.randint(0, 128, (batch, n)), attention_mask=attention_mask)
    return stats.pbs, stats.dense


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
    from inference.pbs_attn.hf import register_hf_attention

    name = register_hf_attention(PBSSettings(attention="pbs", min_len=1000), name="pbs_test_gate")
    model = _tiny_llama(name)
    assert _paths(model, 700) == (0, 2)
    mask = torch.ones(2, 1100, dtype=torch.long)
    mask[1, :5] = 0  # left padding -> a real mask -> SDPA
    assert _paths(model, 1100, batch=2, attention_mask=mask) == (0, 2)


def test_hf_opted_out_layer_stays_on_sdpa() -> None:
    from inference.pbs_attn.hf import register_hf_attention

    # threshold 0.5: layer 0's PBS output differs from dense, so equality below proves layer 1 alone ran PBS
    name = register_hf_attention(
        PBSSettings(attention="pbs", threshold=0.5, min_len=0, dense_layers=(0,)), name="pbs_test_optout"
    )
    model = _tiny_llama(name)
    assert _paths(model, 700) == (1, 1)
    # a τ override of 1.0 is an opt-out too
    name = register_hf_attention(
        PBSSettings(attention="pbs", threshold=0.5, min_len=0, layer_thresholds={1: 1.0}), name="pbs_test_tau1"
    )
    model = _tiny_llama(name)
    assert _paths(model, 700) == (1, 1)


def test_length_thresholds_apply_the_bucket_of_the_prefill_length() -> None:
    s = PBSSettings(
        attention="pbs",
        threshold=0.9,
        dense_layers=(1,),
        layer_thresholds={4: 0.98},
        length_thresholds='{"16384": {"4": 0.99, "1": 0.5}, "32768": {"4": 1.0, "7": 0.95}}',  # type: ignore[arg-type]
    )
    assert s.length_thresholds == {16384: {4: 0.99, 1: 0.5}, 32768: {4: 1.0, 7: 0.95}}
    assert [s.threshold_for(4, n) for n in (None, 8192, 16384, 20000, 32768)] == [0.98, 0.98, 0.99, 0.99, 1.0]
    assert [s.threshold_for(7, n) for n in (16384, 32768)] == [0.9, 0.95]
    assert s.threshold_for(1, 20000) == 1.0  # dense_layers win over every bucket
    # layer 4 is dense at 32K but sparse below: still enabled; the per-prefill τ decides
    assert s.layer_enabled(4) and not s.layer_enabled(1)
    assert PBSSettings(attention="pbs", layer_thresholds={2: 1.0}, length_thresholds={8192: {2: 0.95}}).layer_enabled(2)
    with pytest.raises(ValidationError, match="length_thresholds"):
        PBSSettings(length_thresholds={16384: {4: 1.5}})


def test_per_head_thresholds_parse_validate_and_enable() -> None:
    s = PBSSettings(
        attention="pbs",
        layer_thresholds='{"4": [0.99, 0.9, 1.0]}',  # type: ignore[arg-type]
        length_thresholds='{"32768": {"4": [0.995, 0.98, 0.9], "6": [1.0, 1.0, 1.0]}}',  # type: ignore[arg-type]
    )
    assert s.layer_thresholds == {4: (0.99, 0.9, 1.0)}
    assert s.threshold_for(4) == (0.99, 0.9, 1.0) and s.threshold_for(4, 40000) == (0.995, 0.98, 0.9)
    assert s.layer_enabled(4) and s.layer_enabled(6)  # layer 6 is dense only from 32K, sparse below
    assert not PBSSettings(attention="pbs", layer_thresholds={6: (1.0, 1.0)}).layer_enabled(6)
    for bad in ({4: (0.9, 1.5)}, {4: ()}):
        with pytest.raises(ValidationError, match="layer_thresholds"):
            PBSSettings(layer_thresholds=bad)


def test_hf_attention_runs_a_per_head_tau() -> None:
    from inference.pbs_attn.hf import register_hf_attention

    # _tiny_llama has 4 query heads; a per-head τ with one head below 1.0 keeps PBS on
    name = register_hf_attention(
        PBSSettings(attention="pbs", min_len=0, layer_thresholds={1: (1.0, 0.5, 1.0, 1.0), 0: (1.0,) * 4}),
        name="pbs_test_per_head",
    )
    model = _tiny_llama(name)
    assert _paths(model, 700) == (1, 1)


def test_hf_attention_uses_the_length_bucket_tau() -> None:
    from inference.pbs_attn.hf import register_hf_attention

    # layer 1 runs PBS below 1000 tokens and dense from 1000 on
    name = register_hf_attention(
        PBSSettings(attention="pbs", threshold=0.5, min_len=0, length_thresholds={1000: {1: 1.0}}),
        name="pbs_test_length_bucket",
    )
    model = _tiny_llama(name)
    assert _paths(model, 700) == (2, 0)
    assert _paths(model, 1100) == (1, 1)


def test_hf_registration_is_loud_about_conflicts() -> None:
    from inference.pbs_attn.hf import register_hf_attention

    s = PBSSettings(attention="pbs", threshold=0.8)
    assert register_hf_attention(s, name="pbs_test_dup") == "pbs_test_dup"
    assert register_hf_attention(s, name="pbs_test_dup") == "pbs_test_dup"  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_hf_attention(PBSSettings(attention="pbs", threshold=0.7), name="pbs_test_dup")
    with pytest.raises(ValueError, match="transformers attention implementation"):
        register_hf_attention(s, name="sdpa")


def test_vllm_settings_from_env() -> None:
    from inference.pbs_attn.vllm_backend import settings_from_env

    s = settings_from_env(
        {
            "NEXTGUARD_INFERENCE__PBS__ATTENTION": "pbs",
            "NEXTGUARD_INFERENCE__PBS__MIN_LEN": "4096",
            "OTHER": "x",
        }
    )
    assert s.enabled and s.min_len == 4096 and s.threshold == 0.9
    with pytest.raises(ValidationError):
        settings_from_env({"NEXTGUARD_INFERENCE__PBS__THRESHOLDX": "0.5"})
    assert settings_from_env({"NEXTGUARD_INFERENCE__PBS__DENSE_LAYERS": "[3, 4]"}).dense_layers == (3, 4)


def test_vllm_layer_index_from_layer_name() -> None:
    from inference.pbs_attn.vllm_backend import layer_index

    assert layer_index("model.layers.4.self_attn.attn") == 4
    assert layer_index("language_model.model.layers.17.self_attn.attn") == 17
    assert layer_index("layers.0.attn") == 0
    assert layer_index("model.sublayers_x.attn") is None and layer_index("") is None


def test_vllm_worker_takes_its_tensor_parallel_share_of_a_per_head_tau() -> None:
    from inference.pbs_attn.vllm_backend import shard_threshold

    tau = (0.9, 0.95, 0.98, 0.99)
    assert shard_threshold(0.9, 2, 1) == 0.9
    assert shard_threshold(tau, 4, 0) == tau
    assert shard_threshold(tau, 2, 0) == (0.9, 0.95) and shard_threshold(tau, 2, 1) == (0.98, 0.99)
    assert shard_threshold(tau, 1, 3) == (0.99,)
    with pytest.raises(ValueError, match="tensor-parallel"):
        shard_threshold(tau, 3, 0)
    with pytest.raises(ValueError, match="tensor-parallel"):
        shard_threshold(tau, 2, 2)


def test_vllm_split_requests_fresh_long_prefills_only() -> None:
    from inference.pbs_attn.vllm_backend import split_requests

    s = PBSSettings(attention="pbs", min_len=1000)
    # req0 decode (1 token), req1 fresh 2000-token prefill, req2 later chunk (context 500),
    # req3 short fresh prefill, req4 prefix-cache hit (query 1500 of seq 3000), req5 fresh 1000.
    qlens = [1, 2000, 1500, 300, 1500, 1000]
    seq_lens = [900, 2000, 2000, 300, 3000, 1000]
    qsl = [0]
    for n in qlens:
        qsl.append(qsl[-1] + n)
    split = split_requests(qsl, seq_lens, s)
    assert split.pbs == [1, 5] and split.dense == [0, 2, 3, 4]
    assert split_requests(qsl, seq_lens, PBSSettings(attention="dense", min_len=0)).pbs == []
    assert split_requests(qsl, seq_lens, PBSSettings(attention="pbs", threshold=1.0, min_len=0)).pbs == []
    # a length bucket that makes layer 3 dense from 1500 tokens sends the 2000-token prefill to the stock kernel
    lb = PBSSettings(attention="pbs", min_len=1000, length_thresholds={1500: {3: 1.0}})
    assert split_requests(qsl, seq_lens, lb, layer_idx=3).pbs == [5]
    assert split_requests(qsl, seq_lens, lb, layer_idx=2).pbs == [1, 5]


def test_vllm_restrict_metadata_packs_kept_requests() -> None:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    from inference.pbs_attn.vllm_backend import restrict_metadata

    qsl = torch.tensor([0, 1, 2001, 2002], dtype=torch.int32)
    meta = FlashAttentionMetadata(
        num_actual_tokens=2002,
        max_query_len=2000,
        query_start_loc=qsl,
        max_seq_len=2000,
        seq_lens=torch.tensor([50, 2000, 70], dtype=torch.int32),
        block_table=torch.arange(30).view(3, 10),
        slot_mapping=torch.arange(2002) + 10_000,
        max_num_splits=4,
    )
    sub, idx = restrict_metadata(meta, [0, 2])
    assert idx.tolist() == [0, 2001]
    assert sub.query_start_loc.tolist() == [0, 1, 2]
    assert sub.seq_lens.tolist() == [50, 70] and sub.max_seq_len == 70
    assert sub.block_table.tolist() == [list(range(10)), list(range(20, 30))]
    assert sub.slot_mapping.tolist() == [10_000, 12_001]
    assert (sub.num_actual_tokens, sub.max_query_len, sub.scheduler_metadata, sub.max_num_splits) == (
        2,
        1,
        None,
        0,
    )


def test_vllm_backend_class_resolves_and_registers() -> None:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl
    from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES, AttentionBackendEnum

    from inference.pbs_attn import vllm_backend

    backend = vllm_backend.PBSFlashAttentionBackend
    assert issubclass(backend, FlashAttentionBackend)
    assert issubclass(backend.get_impl_cls(), FlashAttentionImpl)
    vllm_backend.register()
    assert _ATTN_OVERRIDES[AttentionBackendEnum.CUSTOM] == vllm_backend.CLASS_PATH


def test_root_settings_read_the_layer_policy_from_json_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.config import Settings

    monkeypatch.setenv("NEXTGUARD_INFERENCE__PBS__LAYER_THRESHOLDS", '{"3": 0.98}')
    monkeypatch.setenv("NEXTGUARD_INFERENCE__PBS__DENSE_LAYERS", "[0, 4]")
    monkeypatch.setenv("NEXTGUARD_INFERENCE__PBS__LENGTH_THRESHOLDS", '{"32768": {"4": 0.99}}')
    pbs = Settings().inference.pbs
    assert pbs.layer_thresholds == {3: 0.98} and pbs.dense_layers == (0, 4)
    assert pbs.length_thresholds == {32768: {4: 0.99}}
    monkeypatch.setenv("NEXTGUARD_INFERENCE__PBS__LAYER_THRESHOLDS", '{"3": [0.98, 0.9, 0.9]}')
    assert Settings().inference.pbs.layer_thresholds == {3: (0.98, 0.9, 0.9)}
