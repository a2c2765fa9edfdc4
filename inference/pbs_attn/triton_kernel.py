"""Triton PBS-Attn forward: flash-style online softmax over the plan's tiles.

One program = ``BLOCK_M`` query rows of one (batch, query head). Two passes over permuted K/V:

1. **off-diagonal**: key range ``[0, own segment start)``, one ``BLOCK_N`` tile at a time; a tile is
   loaded only if its logical block bit is set in ``block_mask`` (unselected tiles are skipped, and the
   running max / sum / accumulator carry over unchanged). No token mask: every key there is in the past.
2. **diagonal**: the query's own segment, every tile, with the causal mask on *original* indices
   ``perm[key] <= query`` (keys were reordered inside the segment, so positions are no longer monotone).

This module imports Triton at import time; :mod:`inference.pbs_attn.api` only imports it when the
``"triton"`` backend is chosen, so the CPU serving path never does. On CPU tensors the kernel runs in
the Triton interpreter (tests); ``tl.dot`` on bf16 is wrong there (Triton 3.8/3.9), so the interpreter
variant upcasts bf16 tiles to fp32 right after loading.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton import knobs

from inference.pbs_attn.algorithm import PBSPlan, permute_kv


def _pbs_fwd(
    Q,
    K,
    V,
    Out,
    Mask,
    Perm,
    sm_scale_log2,
    N,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_on,
    stride_mb,
    stride_mh,
    stride_mi,
    stride_pb,
    stride_ph,
    H_Q: tl.constexpr,
    KV_GROUP: tl.constexpr,
    PERM_GROUP: tl.constexpr,
    LOGICAL_BLOCK: tl.constexpr,
    SEGMENT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    kv_h = h // KV_GROUP
    p_h = h // PERM_GROUP

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < N, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # Finite initial max: a fully masked row inside one tile then gives exp2(-inf - finite) = 0, never NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    q_block = (pid_m * BLOCK_M) // LOGICAL_BLOCK
    seg_start = ((pid_m * BLOCK_M) // SEGMENT) * SEGMENT
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    mask_row = Mask + b * stride_mb + h * stride_mh + q_block * stride_mi
    offs_n = tl.arange(0, BLOCK_N)

    # Pass 1: selected off-diagonal tiles, no token mask.
    for start_n in range(0, seg_start, BLOCK_N):
        selected = tl.load(mask_row + start_n // LOGICAL_BLOCK)
        if selected != 0:
            cols = start_n + offs_n
            k = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None])
            v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :])
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, k) * sm_scale_log2
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

    # Pass 2: the diagonal segment, token-level causal mask on original indices.
    seg_end = tl.minimum(seg_start + SEGMENT, N)
    perm_base = Perm + b * stride_pb + p_h * stride_ph
    for start_n in range(seg_start, seg_end, BLOCK_N):
        cols = start_n + offs_n
        valid = cols < N
        k = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None], mask=valid[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=valid[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        orig = tl.load(perm_base + cols, mask=valid, other=0)
        keep = (orig[None, :] <= offs_m[:, None]) & valid[None, :]
        s = tl.dot(q, k) * sm_scale_log2
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    acc = acc / l_i[:, None]
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < N)


_pbs_fwd_kernel = triton.jit(_pbs_fwd)


def triton_pbs_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: PBSPlan,
    *,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Tensor:
    """Run the kernel for ``plan``; CUDA tensors compile for the GPU, CPU tensors use the interpreter.

    ``block_m``/``block_n`` must divide the logical block size; head_dim must be a power of two.
    """
    bsz, hq, n, d = q.shape
    lb, seg = plan.block_size, plan.segment_size
    if lb % block_m or lb % block_n:
        raise ValueError(f"block_m ({block_m}) and block_n ({block_n}) must divide block_size ({lb})")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 for the Triton kernel; got {d}")
    k_perm, v_perm = permute_kv(k, v, plan.perm)
    interpret = not q.is_cuda
    if interpret and not knobs.runtime.interpret:
        raise RuntimeError(
            "CPU tensors run the Triton kernel only in the interpreter: set TRITON_INTERPRET=1 before "
            "triton is first imported (Triton reads it at import), or use backend='flex' on CPU"
        )
    upcast = interpret and q.dtype == torch.bfloat16
    q = q.contiguous()
    k_perm = k_perm.contiguous()
    v_perm = v_perm.contiguous()
    out = torch.empty_like(q)
    mask = plan.block_mask.to(torch.int8).contiguous()
    perm = plan.perm.to(torch.int32).contiguous()
    sm_scale = 1.0 / math.sqrt(d) if scale is None else scale
    grid = (triton.cdiv(n, block_m), bsz * hq)
    launch: dict[str, Any] = {} if interpret else {"num_warps": num_warps, "num_stages": num_stages}
    _pbs_fwd_kernel[grid](
        q,
        k_perm,
        v_perm,
        out,
        mask,
        perm,
        sm_scale * 1.4426950408889634,  # log2(e): the kernel uses exp2
        n,
        *q.stride()[:3],
        *k_perm.stride()[:3],
        *v_perm.stride()[:3],
        *out.stride()[:3],
        *mask.stride()[:3],
        *perm.stride()[:2],
        H_Q=hq,
        KV_GROUP=hq // k_perm.shape[1],
        PERM_GROUP=hq // perm.shape[1],
        LOGICAL_BLOCK=lb,
        SEGMENT=seg,
        HEAD_DIM=d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        UPCAST=upcast,
        **launch,
    )
    return out
