"""CPU fast path (compiled flex_attention over the plan's BlockMask) against the fp64 oracle."""

from __future__ import annotations

import pytest
import torch

from inference.pbs_attn import make_plan, pbs_attention, pbs_attention_with_plan
from inference.pbs_attn.algorithm import token_key_mask
from inference.pbs_attn.flex_cpu import build_block_mask, flex_pbs_attention
from inference.pbs_attn.reference import masked_attention_fp64, pbs_reference
from inference.pbs_attn.synthetic import heavy_hitter_qkv
from tests.inference.pbs_tolerances import FP32_ATOL, FP32_RTOL, LOWP_FLOOR, RATIO

RAGGED = [256, 257, 511, 97, 1025]


@pytest.mark.parametrize("n", RAGGED)
def test_flex_matches_reference_ragged_batch_gqa(n: int) -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, n, 64, seed=n)
    plan = make_plan(q, k, threshold=0.8)
    out = flex_pbs_attention(q, k, v, plan)
    torch.testing.assert_close(out.double(), pbs_reference(q, k, v, plan), atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("gqa", ["shared", "replicated"])
def test_flex_head_dim_128_and_gqa_modes(gqa: str) -> None:
    q, k, v = heavy_hitter_qkv(1, 2, 1, 1025, 128, seed=21)
    out, plan = pbs_attention_with_plan(q, k, v, threshold=0.8, gqa=gqa, backend="flex")  # type: ignore[arg-type]
    assert plan is not None and plan.gqa == gqa
    assert plan.selected.any() and (plan.density() < 1.0).all()
    torch.testing.assert_close(out.double(), pbs_reference(q, k, v, plan), atol=FP32_ATOL, rtol=FP32_RTOL)


def test_public_function_is_sparse_and_exact_on_planted_data() -> None:
    q, k, v = heavy_hitter_qkv(1, 4, 2, 2048, 64, seed=22)
    out, plan = pbs_attention_with_plan(q, k, v, backend="flex")
    assert plan is not None
    assert plan.density().mean() < 0.85  # planted structure: τ=0.9 must skip blocks
    torch.testing.assert_close(out.double(), pbs_reference(q, k, v, plan), atol=FP32_ATOL, rtol=FP32_RTOL)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (out - dense).abs().max() > 1e-4  # it really dropped keys


def test_block_mask_skips_unselected_tiles() -> None:
    """The BlockMask must list exactly the plan's tiles: no dense-then-mask."""
    q, k, _ = heavy_hitter_qkv(1, 2, 1, 2048, 64, seed=23)
    plan = make_plan(q, k, threshold=0.8)
    bm = build_block_mask(plan)
    dense_tiles = bm.to_dense()  # (b, h, T, T) of full | partial tiles
    assert torch.equal(dense_tiles.bool(), plan.block_mask)
    assert dense_tiles.sum() < plan.num_blocks * (plan.num_blocks + 1) / 2 * 2 * 0.85


def test_strict_causality_with_finite_future_sentinels() -> None:
    q, k, v = heavy_hitter_qkv(1, 4, 2, 700, 64, seed=24)
    plan = make_plan(q, k, threshold=0.8)
    base = flex_pbs_attention(q, k, v, plan)
    for t in (100, 255, 256, 400, 650):
        v2 = v.clone()
        v2[:, :, t + 1 :] = 1e4  # finite: NaN would leak through 0 * NaN even when masked
        out = flex_pbs_attention(q, k, v2, plan)
        torch.testing.assert_close(out[:, :, : t + 1], base[:, :, : t + 1], atol=FP32_ATOL, rtol=FP32_RTOL)
        assert (out[:, :, t + 1 :] - base[:, :, t + 1 :]).abs().max() > 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_error_within_twice_torch_error(dtype: torch.dtype) -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, 1025, 64, seed=25, dtype=dtype)
    out, plan = pbs_attention_with_plan(q, k, v, threshold=0.9, backend="flex")
    assert plan is not None and out.dtype == dtype
    ref = pbs_reference(q, k, v, plan)
    mask = token_key_mask(plan)
    kx, vx = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    torch_lowp = torch.nn.functional.scaled_dot_product_attention(q, kx, vx, attn_mask=mask)
    err = (out.double() - ref).abs().max().item()
    base = (torch_lowp.double() - ref).abs().max().item()
    assert err <= RATIO * base + LOWP_FLOOR[dtype], (err, base)


def test_fp64_inputs_use_the_oracle() -> None:
    q, k, v = heavy_hitter_qkv(1, 2, 2, 600, 64, seed=26, dtype=torch.float64)
    out, plan = pbs_attention_with_plan(q, k, v)
    assert plan is not None and out.dtype == torch.float64
    torch.testing.assert_close(out, masked_attention_fp64(q, k, v, token_key_mask(plan)), atol=0, rtol=0)
    assert pbs_attention(q, k, v).dtype == torch.float64
