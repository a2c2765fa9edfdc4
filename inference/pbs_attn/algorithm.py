"""PBS-Attn planning: segment-wise key permutation and block selection (arXiv 2510.21270).

Everything here is plain tensor math (no kernels). It produces a :class:`PBSPlan`, which every
attention path consumes (fp64 reference, CPU flex path, Triton kernel), so all paths attend over
exactly the same key set.

Index conventions (``B`` = block size, ``S`` = segment size, ``T = ceil(N / B)``)::

    original keys  : 0 1 2 ... 255 | 256 ... 511 | ... | G*S ... N-1   (tail: N mod S tokens)
    permuted keys  : [seg 0 sorted ] [seg 1 sorted] ...   [tail as is ]
    perm[p]        = original index of the key stored at permuted position p
    key block j    = permuted positions [j*B, (j+1)*B);  segment of block j = j // (S/B)

A key never leaves its segment, so for a query in segment ``a`` every key block of a segment
``b < a`` lies wholly in its past, and blocks of ``b > a`` wholly in its future. Blocks of the
query's own ("diagonal") segment are always computed with a token mask on *original* indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

GQAMode = Literal["shared", "replicated"]
# τ for a whole layer, or one τ per query head (heads differ in how much mass mean-pooling loses).
Threshold = float | Sequence[float]


def _threshold_for_heads(threshold: Threshold, q_heads: int, device: torch.device) -> float | Tensor:
    """A scalar τ as is; a per-head τ as a (q_heads, 1, 1) fp32 tensor that broadcasts over (b, h, T, T).

    fp32, like the cumulative proxy mass it is compared with: a per-head τ then selects exactly what the
    same scalar τ selects for that head (a Python float is compared in the tensor's dtype, fp32, too).
    """
    if isinstance(threshold, int | float):
        return float(threshold)
    taus = [float(t) for t in threshold]
    if len(taus) != q_heads:
        raise ValueError(f"per-head threshold needs one τ per query head ({q_heads}); got {len(taus)}")
    if not all(t > 0.0 for t in taus):
        raise ValueError(f"thresholds must be > 0; got {taus}")
    return torch.tensor(taus, dtype=torch.float32, device=device).view(q_heads, 1, 1)


@dataclass(frozen=True)
class PBSPlan:
    """What the attention kernels need: the key permutation and the selected key blocks.

    ``perm`` has one row per *permutation head*: the KV head in ``"shared"`` GQA mode (one permutation
    per KV group, paper App. G), the query head in ``"replicated"`` mode. ``block_mask[b, h, i, j]``
    says whether query head ``h``'s query block ``i`` attends to permuted key block ``j``; it already
    contains the forced sink block and every block of the diagonal segment.
    """

    perm: Tensor  # (batch, perm_heads, N) int64
    block_mask: Tensor  # (batch, q_heads, T, T) bool
    block_scores: Tensor  # (batch, q_heads, T, T) float32 proxy softmax over off-diagonal candidates
    selected: Tensor  # (batch, q_heads, T, T) bool, threshold selection before forcing sink/diagonal
    n: int
    block_size: int
    segment_size: int
    gqa: GQAMode

    @property
    def num_blocks(self) -> int:
        return self.block_mask.shape[-1]

    @property
    def perm_group(self) -> int:
        """Number of query heads that share one permutation row."""
        return self.block_mask.shape[1] // self.perm.shape[1]

    def perm_for_q_heads(self) -> Tensor:
        """``perm`` expanded to one row per query head, (batch, q_heads, N)."""
        return self.perm.repeat_interleave(self.perm_group, dim=1)

    def density(self) -> Tensor:
        """Computed tiles / causal tiles per (batch, q_head), as in the paper's Table 5.

        Every block of the diagonal segment counts as computed (the kernel does compute it, masked),
        while the denominator counts the causal lower triangle ``T (T + 1) / 2``.
        """
        t = self.num_blocks
        return self.block_mask.sum(dim=(-1, -2)).double() / (t * (t + 1) / 2)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, segment_size: int, block_size: int) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (batch, heads, N, head_dim); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            "PBS-Attn is self-attention over one prefill: q and k must agree on batch, length and head_dim; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if block_size <= 0 or segment_size <= 0 or segment_size % block_size != 0:
        raise ValueError(
            f"segment_size ({segment_size}) must be a positive multiple of block_size ({block_size})"
        )


def segment_permutation(
    q: Tensor,
    k: Tensor,
    *,
    segment_size: int = 256,
    block_size: int = 128,
    gqa: GQAMode = "shared",
    scale: float | None = None,
) -> Tensor:
    """Per-segment key order by descending last-block query importance (paper Eq. 7-8).

    Importance of key ``p`` is the mean, over the last ``block_size`` queries of the prompt, of their
    causal softmax attention probability on ``p`` (fp32). Within each complete segment keys are sorted
    by descending importance; the ``N mod S`` tail keeps its order. In ``"shared"`` mode the importance
    is averaged over the query heads of a KV group, giving one permutation per KV head.

    Returns ``perm`` (batch, perm_heads, N), int64: ``perm[..., p]`` is the original index stored at
    permuted position ``p``.
    """
    bsz, hq, n, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    n_seg = n // segment_size
    perm_heads = hkv if gqa == "shared" else hq
    identity = torch.arange(n, device=q.device).expand(bsz, perm_heads, n).contiguous()
    if n_seg == 0:
        return identity
    n_last = min(block_size, n)
    # scale the (group*n_last, d) queries, not the (group*n_last, N) logits: one pass less over the big tensor
    q_last = (q[:, :, n - n_last :, :].float() * scale).reshape(bsz, hkv, group * n_last, d)
    logits = torch.matmul(q_last, k.float().transpose(-1, -2))  # (b, hkv, group*n_last, n)
    logits = logits.view(bsz, hkv, group, n_last, n)
    # Causal on original positions: unlike the reference code we do not let the last block see its
    # own future keys; it changes nothing but the last block and keeps the proxy a true attention.
    # Only the last n_last key columns can lie in the future of these queries.
    tail = torch.ones(n_last, n_last, dtype=torch.bool, device=q.device).triu(1)
    logits[..., n - n_last :].masked_fill_(tail, float("-inf"))
    importance = torch.softmax(logits, dim=-1).mean(dim=-2)  # (b, hkv, group, n)
    importance = importance.mean(dim=2) if gqa == "shared" else importance.reshape(bsz, hq, n)
    head = importance[..., : n_seg * segment_size].reshape(bsz, perm_heads, n_seg, segment_size)
    # Stable sort: ties (e.g. keys the last block never sees) keep their original order, so the
    # permutation is deterministic run to run.
    order = torch.argsort(head, dim=-1, descending=True, stable=True)
    offsets = torch.arange(n_seg, device=q.device)[:, None] * segment_size
    perm = identity.clone()
    perm[..., : n_seg * segment_size] = (order + offsets).reshape(bsz, perm_heads, n_seg * segment_size)
    return perm


def permute_kv(k: Tensor, v: Tensor, perm: Tensor) -> tuple[Tensor, Tensor]:
    """Gather K and V into permuted order; with replicated GQA ``perm`` has q-head rows and K/V are expanded."""
    if perm.shape[1] != k.shape[1]:
        rep = perm.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    idx = perm[..., None].expand(-1, -1, -1, k.shape[-1])
    return k.gather(2, idx), v.gather(2, idx)


def _block_mean(x: Tensor, block_size: int) -> Tensor:
    """Mean of each block of ``block_size`` rows over its valid rows only (the last block may be short)."""
    bsz, h, n, d = x.shape
    t = -(-n // block_size)
    pad = t * block_size - n
    # no pad (= a full copy of q or k) when N is a multiple of the block size, the common long-prompt case
    xf = x.float() if pad == 0 else torch.nn.functional.pad(x.float(), (0, 0, 0, pad))
    xs = xf.reshape(bsz, h, t, block_size, d).sum(dim=3)
    counts = torch.full((t,), float(block_size), device=x.device)
    counts[-1] = block_size - pad
    return xs / counts[:, None]


def block_segments(t: int, segment_size: int, block_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Segment index of each of ``t`` blocks (blocks never straddle segments: S is a multiple of B)."""
    return torch.arange(t, device=device) // (segment_size // block_size)


def select_blocks(
    q: Tensor,
    k_perm: Tensor,
    perm: Tensor,
    *,
    threshold: Threshold,
    segment_size: int = 256,
    block_size: int = 128,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-(head, query block) smallest set of off-diagonal key blocks reaching proxy mass ``threshold``.

    Proxy: softmax over the causal off-diagonal-segment candidate blocks of mean-pooled query block
    times mean-pooled permuted key block (fp32). Blocks are taken by descending score until the
    cumulative mass reaches ``threshold`` (the block that crosses it is included). If rounding keeps
    the sum below ``threshold``, every candidate is taken (paper Alg. 2; the reference code would take
    none). The sink block (permuted block holding original token 0) and every diagonal-segment block
    are then OR-ed in. ``threshold`` is one τ, or one τ per query head.

    Returns ``(block_mask, block_scores, selected)``, each (batch, q_heads, T, T).
    """
    bsz, hq, n, d = q.shape
    perm_heads = k_perm.shape[1]
    group = hq // perm_heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    t = -(-n // block_size)
    q_bar = _block_mean(q, block_size).view(bsz, perm_heads, group, t, d)
    k_bar = _block_mean(k_perm, block_size)[:, :, None]  # (b, ph, 1, t, d)
    logits = torch.matmul(q_bar, k_bar.transpose(-1, -2)).view(bsz, hq, t, t) * scale

    seg = block_segments(t, segment_size, block_size, q.device)
    candidate = seg[None, :] < seg[:, None]  # (t, t): strictly earlier segment
    logits = logits.masked_fill(~candidate, float("-inf"))
    has_cand = candidate.any(dim=-1)  # rows of segment 0 have none
    scores = torch.softmax(logits, dim=-1)
    scores = torch.where(has_cand[:, None], scores, torch.zeros((), device=q.device))

    sorted_scores, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    cum = sorted_scores.cumsum(dim=-1)
    n_cand = candidate.sum(dim=-1)  # (t,)
    # Blocks strictly below threshold, plus the one that crosses it; capped at the candidate count so
    # "never reached" means "all candidates".
    tau = _threshold_for_heads(threshold, hq, q.device)
    n_keep = torch.minimum((cum < tau).sum(dim=-1) + 1, n_cand)
    keep_sorted = torch.arange(t, device=q.device) < n_keep[..., None]
    selected = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted) & candidate

    inv = torch.empty_like(perm).scatter_(-1, perm, torch.arange(n, device=perm.device).expand_as(perm))
    sink_block = (inv[..., 0] // block_size).repeat_interleave(group, dim=1)  # (b, hq)
    sink = torch.nn.functional.one_hot(sink_block, t).bool()[:, :, None, :] & has_cand[:, None]
    diagonal = seg[None, :] == seg[:, None]
    block_mask = selected | sink | diagonal
    return block_mask, scores, selected


def make_plan(
    q: Tensor,
    k: Tensor,
    *,
    threshold: Threshold = 0.9,
    segment_size: int = 256,
    block_size: int = 128,
    gqa: GQAMode = "shared",
    permute: bool = True,
    scale: float | None = None,
) -> PBSPlan:
    """Permutation + block selection for one causal prefill. ``permute=False`` keeps the identity order
    (same selection rule), which is what the benchmark's "without permutation" curves use. ``threshold``
    is one τ for every head or a sequence with one τ per query head."""
    _check_inputs(q, k, k, segment_size, block_size)
    if gqa not in ("shared", "replicated"):
        raise ValueError(f"Unknown GQA mode {gqa!r}. Available: 'shared', 'replicated'")
    with torch.no_grad():
        if permute:
            perm = segment_permutation(
                q, k, segment_size=segment_size, block_size=block_size, gqa=gqa, scale=scale
            )
        else:
            heads = k.shape[1] if gqa == "shared" else q.shape[1]
            perm = (
                torch.arange(q.shape[2], device=q.device).expand(q.shape[0], heads, q.shape[2]).contiguous()
            )
        k_src = k if gqa == "shared" else k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        k_perm = k_src.gather(2, perm[..., None].expand(-1, -1, -1, k.shape[-1]))
        block_mask, scores, selected = select_blocks(
            q,
            k_perm,
            perm,
            threshold=threshold,
            segment_size=segment_size,
            block_size=block_size,
            scale=scale,
        )
    return PBSPlan(
        perm=perm,
        block_mask=block_mask,
        block_scores=scores,
        selected=selected,
        n=q.shape[2],
        block_size=block_size,
        segment_size=segment_size,
        gqa=gqa,
    )


def token_key_mask(plan: PBSPlan) -> Tensor:
    """The exact key set of the plan as a token mask on original indices, (batch, q_heads, N, N) bool.

    Query ``t`` sees original key ``p`` iff ``p <= t`` and the permuted block holding ``p`` is selected
    for ``t``'s query block. O(N^2): for the reference and for recall measurement only.
    """
    n, bs = plan.n, plan.block_size
    perm = plan.perm_for_q_heads()
    inv = torch.empty_like(perm).scatter_(-1, perm, torch.arange(n, device=perm.device).expand_as(perm))
    key_block = inv // bs  # (b, hq, n): permuted block of each original key
    q_block = torch.arange(n, device=perm.device) // bs
    rows = plan.block_mask[:, :, q_block, :]  # (b, hq, n_q, t)
    allowed = rows.gather(-1, key_block[:, :, None, :].expand(-1, -1, n, -1))
    causal = torch.ones(n, n, dtype=torch.bool, device=perm.device).tril()
    return allowed & causal


def attention_recall(
    q: Tensor, k: Tensor, plan: PBSPlan, *, scale: float | None = None, chunk: int = 1024
) -> Tensor:
    """Mean over queries of the dense causal softmax mass on the plan's keys, per (batch, q_head)."""
    return attention_recall_many(q, k, [plan], scale=scale, chunk=chunk)[0]


def attention_recall_many(
    q: Tensor, k: Tensor, plans: list[PBSPlan], *, scale: float | None = None, chunk: int = 1024
) -> list[Tensor]:
    """:func:`attention_recall` for several plans over the same q/k, computing dense probabilities once.

    Works in query chunks on a (b, hq, chunk, N) slab so that 8K-32K fits in memory. The keys are taken
    in each plan's permuted order, so a chunk's probabilities fold into per-block masses with one
    contiguous reduction; every plan that shares the permutation (all τ of one q/k do: the permutation
    does not depend on τ) is then scored on (chunk, T) block masses instead of (chunk, N) token masks.
    """
    bsz, hq, n, d = q.shape
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kx = k.float().repeat_interleave(group, dim=1)
    totals = [torch.zeros(bsz, hq, dtype=torch.float64, device=q.device) for _ in plans]
    # group the plans by (permutation, block size)
    groups: list[tuple[Tensor, int, list[int]]] = []
    for idx, plan in enumerate(plans):
        perm = plan.perm_for_q_heads()
        for g_perm, g_bs, members in groups:
            if g_bs == plan.block_size and torch.equal(g_perm, perm):
                members.append(idx)
                break
        else:
            groups.append((perm, plan.block_size, [idx]))
    for perm, bs, members in groups:
        t = -(-n // bs)
        k_perm = kx.gather(2, perm[..., None].expand(-1, -1, -1, d))
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            logits = torch.matmul(q[:, :, start:stop].float(), k_perm.transpose(-1, -2)) * scale
            pos = torch.arange(start, stop, device=q.device)
            future = perm[:, :, None, :] > pos[None, None, :, None]  # original index of each permuted key
            probs = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)
            if t * bs != n:
                probs = torch.nn.functional.pad(probs, (0, t * bs - n))
            mass = probs.view(bsz, hq, stop - start, t, bs).sum(dim=-1)  # (b, hq, chunk, T)
            for idx in members:
                rows = plans[idx].block_mask[:, :, pos // bs, :]
                totals[idx] += (mass * rows).sum(dim=-1).double().sum(dim=-1)
    return [total / n for total in totals]
