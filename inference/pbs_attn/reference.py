"""fp64 oracle: softmax over exactly the key set a :class:`PBSPlan` implies.

Deliberately naive (materialises the (N, N) token mask): it is the spec every fast path is tested
against, not something to run at long lengths.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from inference.pbs_attn.algorithm import PBSPlan, token_key_mask


def masked_attention_fp64(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, scale: float | None = None
) -> Tensor:
    """softmax(q k^T * scale + log(mask)) v in fp64 with GQA by head repetition; mask (b|1, hq|1, N, N)."""
    hq, hkv = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kx = k.double().repeat_interleave(hq // hkv, dim=1)
    vx = v.double().repeat_interleave(hq // hkv, dim=1)
    logits = torch.matmul(q.double(), kx.transpose(-1, -2)) * scale
    logits = logits.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(logits, dim=-1), vx)


def dense_causal_fp64(q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None) -> Tensor:
    """Dense causal attention in fp64 (the ``threshold >= 1`` / short-input semantics)."""
    n = q.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return masked_attention_fp64(q, k, v, causal, scale=scale)


def pbs_reference(q: Tensor, k: Tensor, v: Tensor, plan: PBSPlan, *, scale: float | None = None) -> Tensor:
    """PBS attention in fp64 over the plan's key set; K/V are used in original order (Lemma 3.1)."""
    return masked_attention_fp64(q, k, v, token_key_mask(plan), scale=scale)
