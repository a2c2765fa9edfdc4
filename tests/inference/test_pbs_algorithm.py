"""PBS-Attn planning and fp64-oracle properties (CPU, no compilation)."""

from __future__ import annotations

import math

import pytest
import torch

from inference.pbs_attn import make_plan, pbs_attention
from inference.pbs_attn.algorithm import (
    PBSPlan,
    attention_recall,
    attention_recall_many,
    block_segments,
    segment_permutation,
    select_blocks,
    token_key_mask,
)
from inference.pbs_attn.api import get_backend, use_dense
from inference.pbs_attn.reference import dense_causal_fp64, masked_attention_fp64, pbs_reference
from inference.pbs_attn.synthetic import heavy_hitter_qkv

S, B = 256, 128
RAGGED = [S, S + 1, 2 * S - 1, 97, 257, 1025]


def _all_candidates(plan: PBSPlan) -> torch.Tensor:
    t = plan.num_blocks
    seg = block_segments(t, plan.segment_size, plan.block_size)
    return seg[None, :] <= seg[:, None]


@pytest.mark.parametrize("n", RAGGED)
def test_dense_equivalence_when_all_blocks_selected(n: int) -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, n, 64, seed=n, dtype=torch.float64)
    plan = make_plan(q, k, threshold=0.999999)
    assert torch.equal(plan.block_mask, _all_candidates(plan).expand_as(plan.block_mask))
    torch.testing.assert_close(
        pbs_reference(q, k, v, plan), dense_causal_fp64(q, k, v), atol=1e-12, rtol=1e-12
    )


def test_threshold_one_means_dense_sdpa() -> None:
    q, k, v = heavy_hitter_qkv(1, 2, 2, 1025, 64, seed=3)
    out = pbs_attention(q, k, v, threshold=1.0)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out, dense)
    # int 1 crashed the reference code; it must be the same dense path here.
    assert torch.equal(pbs_attention(q, k, v, threshold=1), dense)


def test_length_gate_and_single_segment_are_dense() -> None:
    assert use_dense(4096, threshold=0.9, segment_size=S, min_len=8192)
    assert use_dense(S, threshold=0.9, segment_size=S, min_len=0)
    assert not use_dense(S + 1, threshold=0.9, segment_size=S, min_len=0)
    q, k, v = heavy_hitter_qkv(1, 2, 1, 600, 64, seed=4)
    gated = pbs_attention(q, k, v, min_len=601)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(gated, dense)


def test_reference_matches_bruteforce_key_lists() -> None:
    """token_key_mask is the spec: rebuild it key by key from perm and block_mask and compare."""
    q, k, v = heavy_hitter_qkv(1, 2, 1, 700, 32, seed=5, dtype=torch.float64)
    plan = make_plan(q, k, threshold=0.7)
    perm = plan.perm_for_q_heads()
    out = pbs_reference(q, k, v, plan)
    for h in range(2):
        for t in (0, 130, 255, 256, 511, 699):
            keys = [
                int(perm[0, h, p])
                for p in range(700)
                if plan.block_mask[0, h, t // B, p // B] and int(perm[0, h, p]) <= t
            ]
            logits = (q[0, h, t] @ k[0, 0, keys].T) / math.sqrt(32)
            expect = torch.softmax(logits, dim=-1) @ v[0, 0, keys]
            torch.testing.assert_close(out[0, h, t], expect, atol=1e-12, rtol=1e-12)


def test_planted_sparse_mask_changes_output_and_reference_respects_it() -> None:
    """A planted block mask that drops a whole past segment must drop exactly those keys."""
    q, k, v = heavy_hitter_qkv(1, 2, 2, 1024, 64, seed=6, dtype=torch.float64)
    plan = make_plan(q, k, threshold=0.999999)
    bm = plan.block_mask.clone()
    bm[:, :, 4:, 2:4] = False  # queries of segments 2-3 skip segment 1
    planted = PBSPlan(plan.perm, bm, plan.block_scores, plan.selected, plan.n, B, S, plan.gqa)
    mask = token_key_mask(planted)
    perm = plan.perm_for_q_heads()
    seg1_keys = perm[0, 0, 256:512]
    assert not mask[0, 0, 512:, seg1_keys].any()
    assert mask[0, 0, 300, seg1_keys].sum() == int((seg1_keys <= 300).sum())
    out = pbs_reference(q, k, v, planted)
    torch.testing.assert_close(
        out[..., :512, :], dense_causal_fp64(q, k, v)[..., :512, :], atol=1e-12, rtol=0
    )
    assert (out[..., 512:, :] - dense_causal_fp64(q, k, v)[..., 512:, :]).abs().max() > 1e-3


@pytest.mark.parametrize("gqa", ["shared", "replicated"])
@pytest.mark.parametrize("n", [1025, 2 * S - 1, 3 * S])
def test_permutation_is_within_segment_bijection_with_untouched_tail(n: int, gqa: str) -> None:
    q, k, _ = heavy_hitter_qkv(2, 4, 2, n, 64, seed=7)
    perm = segment_permutation(q, k, segment_size=S, block_size=B, gqa=gqa)  # type: ignore[arg-type]
    assert perm.shape == (2, 2 if gqa == "shared" else 4, n)
    full = (n // S) * S
    segs = perm[..., :full].reshape(*perm.shape[:2], n // S, S)
    expect = torch.arange(full).reshape(n // S, S)
    assert torch.equal(segs.sort(dim=-1).values, expect.expand_as(segs))
    assert torch.equal(perm[..., full:], torch.arange(full, n).expand(*perm.shape[:2], n - full))
    # Planted heavy hitters must actually be moved to the front of their segment.
    assert not torch.equal(perm[..., :full], torch.arange(full).expand_as(perm[..., :full]))


def test_permutation_sorts_by_last_block_importance() -> None:
    q, k, _ = heavy_hitter_qkv(1, 1, 1, 512, 64, seed=8, dtype=torch.float64)
    perm = segment_permutation(q, k, segment_size=S, block_size=B)
    probs = torch.softmax(
        (q[0, 0, -B:] @ k[0, 0].T) / 8.0 + torch.triu(torch.full((B, 512), -math.inf), 512 - B + 1), -1
    )
    importance = probs.mean(0)
    for s in range(2):
        imp = importance[perm[0, 0, s * S : (s + 1) * S]]
        assert (imp[:-1] >= imp[1:]).all()


def test_joint_kv_shuffle_within_segments_leaves_all_blocks_output_unchanged() -> None:
    q, k, v = heavy_hitter_qkv(1, 2, 1, 800, 64, seed=9, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    shuffle = torch.cat([torch.randperm(S, generator=g) + s * S for s in range(3)] + [torch.arange(768, 800)])
    # Original positions move with the keys: permuting whole (position, key, value) triples inside a
    # segment is exactly what PBS does internally, so the dense-causal result cannot change.
    ks, vs = k[:, :, shuffle], v[:, :, shuffle]
    mask = torch.ones(800, 800, dtype=torch.bool).tril()[:, shuffle]
    torch.testing.assert_close(
        masked_attention_fp64(q, ks, vs, mask), dense_causal_fp64(q, k, v), atol=1e-12, rtol=0
    )
    plan = make_plan(q, k, threshold=0.999999)
    torch.testing.assert_close(pbs_reference(q, k, v, plan), dense_causal_fp64(q, k, v), atol=1e-12, rtol=0)


@pytest.mark.parametrize("tau", [0.5, 0.8, 0.9, 0.95])
def test_selection_is_minimal_and_reaches_threshold(tau: float) -> None:
    q, k, _ = heavy_hitter_qkv(2, 4, 2, 2048, 64, seed=10)
    plan = make_plan(q, k, threshold=tau)
    t = plan.num_blocks
    seg = block_segments(t, S, B)
    cand = seg[None, :] < seg[:, None]
    scores, sel = plan.block_scores, plan.selected
    assert not (sel & ~cand).any()
    mass = (scores * sel).sum(-1)
    rows = cand.any(-1)
    n_cand = cand.sum(-1).expand_as(mass)
    n_sel = sel.sum(-1)
    reached = mass[..., rows] >= tau - 1e-6
    took_all = n_sel[..., rows] == n_cand[..., rows]
    assert (reached | took_all).all()
    # Minimal: dropping the smallest selected block falls below τ.
    smallest = torch.where(sel, scores, torch.full_like(scores, math.inf)).min(-1).values
    assert ((mass - smallest)[..., rows] < tau).all()
    # Sparsity really happens on planted data.
    assert sel[..., rows, :].sum() < cand[rows].sum() * 2 * 4 * 0.8


def test_sink_and_diagonal_segment_always_present() -> None:
    q, k, _ = heavy_hitter_qkv(2, 4, 2, 1500, 64, seed=11)
    plan = make_plan(q, k, threshold=0.3)
    t = plan.num_blocks
    seg = block_segments(t, S, B)
    diag = seg[None, :] == seg[:, None]
    assert plan.block_mask[..., diag].all()
    perm = plan.perm_for_q_heads()
    sink_block = (perm == 0).float().argmax(-1) // B  # (b, hq)
    rows_with_past = seg >= 1
    picked = plan.block_mask.gather(-1, sink_block[:, :, None, None].expand(-1, -1, t, 1))[..., 0]
    assert picked[..., rows_with_past].all()
    # Segment-0 query blocks see only their own segment; nothing from future segments anywhere.
    assert not plan.block_mask[..., seg == 0, :][..., seg > 0].any()
    assert not (plan.block_mask & (seg[None, :] > seg[:, None])).any()


def test_threshold_never_reached_selects_all_candidates() -> None:
    """Rounding can keep the fp32 cumulative sum below τ; then every candidate is taken (paper rule)."""
    q, k, _ = heavy_hitter_qkv(1, 2, 2, 1024, 64, seed=12)
    perm = segment_permutation(q, k)
    k_perm = k.gather(2, perm[..., None].expand(-1, -1, -1, 64))
    bm, _, sel = select_blocks(q, k_perm, perm, threshold=1.0 - 1e-9)
    seg = block_segments(8, S, B)
    assert torch.equal(sel, (seg[None, :] < seg[:, None]).expand_as(sel))


def test_recall_is_one_for_all_blocks_and_below_for_sparse() -> None:
    q, k, _ = heavy_hitter_qkv(1, 2, 1, 2048, 64, seed=13)
    full = attention_recall(q, k, make_plan(q, k, threshold=0.999999))
    torch.testing.assert_close(full, torch.ones_like(full), atol=1e-5, rtol=0)
    sparse_plan = make_plan(q, k, threshold=0.8)
    sparse = attention_recall(q, k, sparse_plan)
    assert (sparse < 0.9999).all() and (sparse > 0.8).all()
    assert (sparse_plan.density() < 0.9).all()


def test_permutation_buys_density_at_equal_threshold() -> None:
    q, k, _ = heavy_hitter_qkv(1, 2, 1, 2048, 64, seed=14)
    with_perm = make_plan(q, k, threshold=0.9)
    without = make_plan(q, k, threshold=0.9, permute=False)
    assert with_perm.density().mean() < without.density().mean() - 0.05
    assert attention_recall(q, k, with_perm).mean() >= attention_recall(q, k, without).mean() - 0.01


def test_unknown_backend_suggests_name() -> None:
    with pytest.raises(KeyError, match="Did you mean 'flex'"):
        get_backend("flx")


def test_bad_shapes_raise() -> None:
    q = torch.zeros(1, 3, 300, 64)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        make_plan(q, torch.zeros(1, 2, 300, 64))
    with pytest.raises(ValueError, match="multiple of block_size"):
        make_plan(q, torch.zeros(1, 3, 300, 64), segment_size=200)


@pytest.mark.parametrize(("n", "gqa"), [(97, "shared"), (257, "replicated"), (1025, "shared")])
def test_recall_matches_fp64_mass_on_the_token_key_set(n: int, gqa: str) -> None:
    """The block-folded recall equals the fp64 softmax mass on exactly the plan's token key set, for several
    τ at once (plans sharing one permutation), ragged lengths and both GQA modes."""
    q, k, _ = heavy_hitter_qkv(2, 4, 2, n, 64, seed=21)
    plans = [make_plan(q, k, threshold=t, segment_size=S, block_size=B, gqa=gqa) for t in (0.5, 0.8, 0.95)]
    got = attention_recall_many(q, k, plans, chunk=100)
    kx = k.double().repeat_interleave(2, dim=1)
    logits = torch.matmul(q.double(), kx.transpose(-1, -2)) / math.sqrt(64)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    for plan, rec in zip(plans, got, strict=True):
        want = (probs * token_key_mask(plan)).sum(-1).mean(-1)
        torch.testing.assert_close(rec, want, atol=1e-5, rtol=0)
    if n > 4 * S:           # enough off-diagonal segments for τ to matter: the check can fail
        assert got[0].mean() < got[2].mean() < 1.0


def test_per_head_threshold_selects_what_each_heads_scalar_tau_selects() -> None:
    q, k, v = heavy_hitter_qkv(2, 4, 2, 1025, 64, seed=21)
    taus = [0.5, 0.9, 0.99, 1.0]
    plan = make_plan(q, k, threshold=taus)
    for h, tau in enumerate(taus):
        alone = make_plan(q, k, threshold=tau)
        assert torch.equal(plan.block_mask[:, h], alone.block_mask[:, h]), f"head {h} (τ {tau})"
    # heads really differ, and the τ = 1.0 head takes every candidate block
    density = plan.density()
    assert (density[:, 0] < density[:, 2]).all()
    assert torch.equal(plan.block_mask[:, 3], _all_candidates(plan).expand_as(plan.block_mask[:, 3]))
    # the public function runs it sparse (some heads below 1) and matches the fp64 oracle on that plan
    out = pbs_attention(q.double(), k.double(), v.double(), threshold=taus)
    torch.testing.assert_close(out, pbs_reference(q.double(), k.double(), v.double(), plan), atol=1e-12, rtol=0)


def test_per_head_threshold_is_validated_and_all_ones_is_dense() -> None:
    q, k, v = heavy_hitter_qkv(1, 4, 2, 600, 64, seed=22)
    with pytest.raises(ValueError, match="one τ per query head"):
        make_plan(q, k, threshold=[0.9, 0.9])
    with pytest.raises(ValueError, match="> 0"):
        make_plan(q, k, threshold=[0.9, 0.0, 0.9, 0.9])
    assert use_dense(4096, threshold=(1.0, 1.0), segment_size=S, min_len=0)
    assert not use_dense(4096, threshold=(1.0, 0.99), segment_size=S, min_len=0)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(pbs_attention(q, k, v, threshold=[1.0] * 4), dense)
