"""CPU gather path (vectorised block gather + batched GEMMs) against the fp64 oracle."""

from __future__ import annotations

import pytest
import torch

from inference.pbs_attn import make_plan, pbs_attention_with_plan
from inference.pbs_attn.algorithm import PBSPlan, permute_kv, token_key_mask
from inference.pbs_attn.api import get_backend
from inference.pbs_attn.gather_cpu import gather_pbs_attention
from inference.pbs_attn.reference import pbs_reference
from inference.pbs_attn.synthetic import heavy_hitter_qkv
from tests.inference.pbs_tolerances import FP32_ATOL, FP32_RTOL, LOWP_FLOOR, RATIO

# S, S+1, 2S-1, 97 (< one block), 257, 1025 with S = 256.
RAGGED = [256, 257, 511, 97, 1025]


def _close_to_reference(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: PBSPlan
) -> None:
    torch.testing.assert_close(out.double(), pbs_reference(q, k, v, plan), atol=FP32_ATOL, rtol=FP32_RTOL)


def test_registered_as_backend() -> None:
    assert get_backend("gather") is gather_pbs_attention


@pytest.mark.parametrize("n", RAGGED)
def test_gather_matches_reference_ragged_batch_gqa(n: int) -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, n, 64, seed=n)
    plan = make_plan(q, k, threshold=0.8)
    out = gather_pbs_attention(q, k, v, plan)
    assert out.shape == q.shape and out.dtype == q.dtype
    _close_to_reference(out, q, k, v, plan)


@pytest.mark.parametrize("n", [512, 700])
def test_strided_inputs_as_transformers_passes_them(n: int) -> None:
    # transformers hands attention (B, H, N, D) views of (B, N, H, D) storage; a whole number of blocks
    # (n = 512) used to hit a .view() on the strided layout
    q, k, v = heavy_hitter_qkv(1, 4, 2, n, 64, seed=3)
    qs, ks, vs = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qs.is_contiguous()
    plan = make_plan(qs, ks, threshold=0.8)
    out = gather_pbs_attention(qs, ks, vs, plan)
    torch.testing.assert_close(out, gather_pbs_attention(q, k, v, plan), atol=1e-6, rtol=1e-6)
    _close_to_reference(out, q, k, v, plan)


@pytest.mark.parametrize("gqa", ["shared", "replicated"])
@pytest.mark.parametrize("d", [64, 128])
def test_gather_head_dims_and_gqa_modes(gqa: str, d: int) -> None:
    q, k, v = heavy_hitter_qkv(2, 6, 2, 1025, d, seed=31 + d)
    out, plan = pbs_attention_with_plan(q, k, v, threshold=0.8, gqa=gqa, backend="gather")  # type: ignore[arg-type]
    assert plan is not None and plan.gqa == gqa
    assert plan.selected.any() and (plan.density() < 1.0).all()
    _close_to_reference(out, q, k, v, plan)


@pytest.mark.parametrize(
    ("chunk_elems", "q_tile"), [(1, None), (1, 32), (128 * 640, None), (128 * 640, 64), (1 << 30, None)]
)
def test_chunking_does_not_change_the_result(chunk_elems: int, q_tile: int | None) -> None:
    """One row per chunk, a few rows (ragged padding inside chunks), one chunk; with query sub-tiles."""
    q, k, v = heavy_hitter_qkv(1, 4, 2, 1500, 64, seed=32)
    plan = make_plan(q, k, threshold=0.8)
    out = gather_pbs_attention(q, k, v, plan, chunk_elems=chunk_elems, q_tile=q_tile)
    _close_to_reference(out, q, k, v, plan)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_worker_threads_do_not_change_the_result(workers: int) -> None:
    """Chunks dealt to single-threaded worker threads; the caller's thread count is left alone."""
    q, k, v = heavy_hitter_qkv(2, 4, 2, 1500, 64, seed=40)
    plan = make_plan(q, k, threshold=0.8)
    threads = torch.get_num_threads()
    out = gather_pbs_attention(q, k, v, plan, workers=workers, chunk_elems=128 * 640)
    assert torch.get_num_threads() == threads
    _close_to_reference(out, q, k, v, plan)
    q.requires_grad_(True)
    assert not gather_pbs_attention(q, k, v, plan, workers=workers).requires_grad
    # a caller in inference mode (as a served forward is): the workers write its output in that mode
    with torch.inference_mode():
        qi, ki, vi = q.detach().clone(), k.clone(), v.clone()
        out = gather_pbs_attention(qi, ki, vi, plan, workers=workers, chunk_elems=128 * 640)
    assert out.is_inference()
    _close_to_reference(out, q.detach(), k, v, plan)


def test_sparse_and_exact_on_planted_data() -> None:
    q, k, v = heavy_hitter_qkv(1, 4, 2, 2048, 64, seed=33)
    out, plan = pbs_attention_with_plan(q, k, v, backend="gather")
    assert plan is not None
    assert plan.density().mean() < 0.85  # planted structure: τ=0.9 must skip blocks
    _close_to_reference(out, q, k, v, plan)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (out - dense).abs().max() > 1e-4  # it really dropped keys


def test_all_blocks_equal_dense_sdpa() -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, 1100, 64, seed=34)
    plan = make_plan(q, k, threshold=0.8)
    t = plan.num_blocks
    full = torch.ones(t, t, dtype=torch.bool).tril().expand_as(plan.block_mask)
    seg = torch.arange(t) // (plan.segment_size // plan.block_size)
    all_blocks = full | (seg[None, :] == seg[:, None])
    dense_plan = PBSPlan(
        perm=plan.perm,
        block_mask=all_blocks.contiguous(),
        block_scores=plan.block_scores,
        selected=plan.selected,
        n=plan.n,
        block_size=plan.block_size,
        segment_size=plan.segment_size,
        gqa=plan.gqa,
    )
    out = gather_pbs_attention(q, k, v, dense_plan)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, dense, atol=FP32_ATOL, rtol=FP32_RTOL)


def test_strict_causality_with_finite_future_sentinels() -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, 700, 64, seed=35)
    plan = make_plan(q, k, threshold=0.8)
    base = gather_pbs_attention(q, k, v, plan)
    for t in (100, 255, 256, 400, 650):
        v2 = v.clone()
        v2[:, :, t + 1 :] = 1e4  # finite: NaN would leak through 0 * NaN even when masked
        out = gather_pbs_attention(q, k, v2, plan)
        torch.testing.assert_close(out[:, :, : t + 1], base[:, :, : t + 1], atol=FP32_ATOL, rtol=FP32_RTOL)
        assert (out[:, :, t + 1 :] - base[:, :, t + 1 :]).abs().max() > 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_error_within_twice_torch_error(dtype: torch.dtype) -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, 1025, 64, seed=36, dtype=dtype)
    out, plan = pbs_attention_with_plan(q, k, v, threshold=0.9, backend="gather")
    assert plan is not None and out.dtype == dtype
    ref = pbs_reference(q, k, v, plan)
    mask = token_key_mask(plan)
    kx, vx = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    torch_lowp = torch.nn.functional.scaled_dot_product_attention(q, kx, vx, attn_mask=mask)
    err = (out.double() - ref).abs().max().item()
    base = (torch_lowp.double() - ref).abs().max().item()
    assert err <= RATIO * base + LOWP_FLOOR[dtype], (err, base)


def test_fp64_stays_fp64() -> None:
    q, k, v = heavy_hitter_qkv(1, 2, 1, 600, 64, seed=37, dtype=torch.float64)
    plan = make_plan(q, k, threshold=0.8)
    out = gather_pbs_attention(q, k, v, plan)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, pbs_reference(q, k, v, plan), atol=1e-12, rtol=1e-12)


def test_skips_unselected_blocks() -> None:
    """Gathered key blocks = the plan's off-diagonal tiles + own-segment tiles + padding, never all causal tiles."""
    q, k, v = heavy_hitter_qkv(1, 2, 1, 4096, 64, seed=38)
    plan = make_plan(q, k, threshold=0.8)
    gathered = 0
    original = torch.index_select

    def counting(src: torch.Tensor, dim: int, index: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        nonlocal gathered
        if src.dim() == 3 and src.shape[1] == plan.block_size:
            gathered += index.numel()
        return original(src, dim, index, **kwargs)

    torch.index_select = counting  # type: ignore[assignment]
    try:
        gather_pbs_attention(q, k, v, plan)
    finally:
        torch.index_select = original
    t = plan.num_blocks
    tiles = int(plan.block_mask.sum())
    causal_tiles = 2 * t * (t + 1) // 2
    # q rows (one block per row) + K and V blocks (padding included) per row.
    kv_blocks = (gathered - 2 * t) / 2
    assert tiles <= kv_blocks <= 1.1 * tiles
    assert kv_blocks < 0.85 * causal_tiles


def test_permuted_kv_is_what_is_attended() -> None:
    """Sanity: with the identity permutation the gather path equals masked attention on original K/V."""
    q, k, v = heavy_hitter_qkv(1, 2, 2, 777, 64, seed=39)
    plan = make_plan(q, k, threshold=0.8, permute=False)
    k_perm, v_perm = permute_kv(k, v, plan.perm)
    assert torch.equal(k_perm, k) and torch.equal(v_perm, v)
    _close_to_reference(gather_pbs_attention(q, k, v, plan), q, k, v, plan)
