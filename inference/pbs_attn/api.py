"""Public entry point ``pbs_attention`` and the registry of attention paths behind it."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from inference.pbs_attn.algorithm import GQAMode, PBSPlan, Threshold, make_plan
from inference.pbs_attn.config import tau_floor

Backend = Literal["auto", "gather", "flex", "triton", "reference"]

# Lazy import paths: Triton is only imported when the "triton" path is actually chosen, so the CPU
# serving path never imports it.
_BACKENDS: dict[str, str] = {
    "gather": "inference.pbs_attn.gather_cpu:gather_pbs_attention",
    "flex": "inference.pbs_attn.flex_cpu:flex_pbs_attention",
    "triton": "inference.pbs_attn.triton_kernel:triton_pbs_attention",
    "reference": "inference.pbs_attn.reference:pbs_reference",
}


# What ``backend="auto"`` runs for fp32/bf16/fp16 CPU tensors (``bench.py --backend`` defaults to it too).
# gather beat compiled flex by 1.4-1.5x at 8K/16K on the 2-core Xeon, quiet or contended (README).
CPU_DEFAULT_BACKEND = "gather"


def register_backend(name: str, target: str) -> None:
    """Add an attention path as ``"module:function"`` taking ``(q, k, v, plan, *, scale)``; duplicates raise."""
    if name in _BACKENDS or name == "auto":
        raise ValueError(f"PBS backend {name!r} is already registered")
    _BACKENDS[name] = target


def get_backend(name: str) -> Callable[..., Tensor]:
    """Resolve a backend name to its function (imports it on first use)."""
    if name not in _BACKENDS:
        close = difflib.get_close_matches(name, list(_BACKENDS), n=1)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        raise KeyError(f"Unknown PBS backend {name!r}. {hint}Available: {sorted(_BACKENDS)}")
    module, _, func = _BACKENDS[name].partition(":")
    fn: Callable[..., Tensor] = getattr(importlib.import_module(module), func)
    return fn


def default_backend(q: Tensor) -> str:
    """Triton on CUDA, ``CPU_DEFAULT_BACKEND`` (gather) on CPU, the fp64 oracle for fp64 inputs."""
    if q.dtype == torch.float64:
        return "reference"
    return "triton" if q.is_cuda else CPU_DEFAULT_BACKEND


def use_dense(n: int, *, threshold: Threshold, segment_size: int, min_len: int) -> bool:
    """The dense-fallback rule shared by every integration.

    Dense when ``threshold >= 1`` for every head (all mass requested), when the prompt is shorter than the
    length gate, or when it fits in one segment (then every key is in the diagonal segment anyway). A
    per-head τ with some heads at 1.0 stays sparse: those heads select every candidate block.
    """
    return tau_floor(threshold) >= 1.0 or n < min_len or n <= segment_size


def dense_causal(q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None) -> Tensor:
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )


def pbs_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    threshold: Threshold = 0.9,
    segment_size: int = 256,
    block_size: int = 128,
    min_len: int = 0,
    gqa: GQAMode = "shared",
    scale: float | None = None,
    backend: Backend | str = "auto",
) -> Tensor:
    """Permuted block-sparse causal self-attention for one prefill.

    Args:
        q: (batch, q_heads, N, head_dim) queries in original order (after RoPE).
        k, v: (batch, kv_heads, N, head_dim); ``q_heads`` must be a multiple of ``kv_heads`` (GQA).
        threshold: proxy attention mass τ each (head, query block) must reach; ``>= 1.0`` means dense.
            A sequence gives one τ per query head.
        segment_size: S, permutation segment; a multiple of ``block_size``.
        block_size: B, selection granularity (query and key blocks).
        min_len: length gate; shorter prompts run dense causal SDPA (0 = no gate).
        gqa: ``"shared"`` (one permutation per KV head, default) or ``"replicated"`` (per query head).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        backend: ``"auto"``, ``"gather"`` (CPU), ``"flex"`` (CPU), ``"triton"`` (CUDA or Triton interpreter), ``"reference"`` (fp64 oracle).

    Returns:
        (batch, q_heads, N, head_dim) in ``q.dtype``, original token order.
    """
    out, _ = pbs_attention_with_plan(
        q,
        k,
        v,
        threshold=threshold,
        segment_size=segment_size,
        block_size=block_size,
        min_len=min_len,
        gqa=gqa,
        scale=scale,
        backend=backend,
    )
    return out


def pbs_attention_with_plan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    threshold: Threshold = 0.9,
    segment_size: int = 256,
    block_size: int = 128,
    min_len: int = 0,
    gqa: GQAMode = "shared",
    scale: float | None = None,
    backend: Backend | str = "auto",
    **backend_kwargs: Any,
) -> tuple[Tensor, PBSPlan | None]:
    """:func:`pbs_attention` that also returns the plan it used (``None`` when it ran dense)."""
    if use_dense(q.shape[2], threshold=threshold, segment_size=segment_size, min_len=min_len):
        return dense_causal(q, k, v, scale=scale), None
    plan = make_plan(
        q, k, threshold=threshold, segment_size=segment_size, block_size=block_size, gqa=gqa, scale=scale
    )
    name = default_backend(q) if backend == "auto" else backend
    out = get_backend(name)(q, k, v, plan, scale=scale, **backend_kwargs)
    return out.to(q.dtype), plan
