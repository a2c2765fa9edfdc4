"""CPU path: compiled ``flex_attention`` over a ``BlockMask`` built straight from the PBS plan.

No longer the CPU default (``backend="flex"`` selects it): on the 2-core Xeon the chunked gather path
(``gather_cpu.py``) measured 1.4-1.5x faster (README). Original rationale, from the AMD calibration: on those CPUs the compiled, tiled flex kernel
keeps ~90 % of the ideal 1/density speedup and breaks even with dense SDPA only near 100 % density,
while an eager gather+GEMM loop needs a Python iteration per (head, query block) and falls out of
cache at long rows (see ``shared/reference/pbs-cpu-calibration.md``).

Mapping of the plan onto flex (per batch, query head, query block ``i``):

* off-diagonal selected key blocks -> *full* blocks: computed without any mask_mod call;
* every block of ``i``'s own segment -> *partial* blocks: ``mask_mod`` applies the token-level causal
  mask on original indices, ``perm[kv] <= q``;
* everything else is absent from the index lists, so the kernel never touches it.

Attention runs on permuted K/V (Lemma 3.1: a joint K/V permutation leaves the output unchanged).
bf16/fp16 inputs run in fp32: the CPU flex kernel is slower in bf16 than in fp32 (calibration note),
and the output is cast back to the input dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from inference.pbs_attn.algorithm import PBSPlan, block_segments, permute_kv

_compiled: Callable[..., Any] | None = None
_static: dict[tuple[Any, ...], Callable[..., Any]] = {}
logger = logging.getLogger(__name__)


def _flex() -> Callable[..., Any]:
    """Compile flex_attention once per process; ``dynamic=True`` avoids a recompile per prompt length."""
    global _compiled
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _configure_dynamo()
        _compiled = torch.compile(flex_attention, dynamic=True)
    return _compiled


def _configure_dynamo() -> None:
    import torch._dynamo.config as dynamo_config

    # Past the recompile limit Dynamo would silently run flex_attention *eagerly*, which on CPU is the
    # dense-then-mask math path. Raise instead, and allow enough shape variants for a test session.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    dynamo_config.fail_on_recompile_limit_hit = True


def _run_flex(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float | None) -> Tensor:
    kwargs = {"block_mask": block_mask, "scale": scale, "enable_gqa": k.shape[1] != q.shape[1]}
    key = (tuple(q.shape), tuple(k.shape), q.dtype, block_mask.BLOCK_SIZE)
    if key in _static:
        out: Tensor = _static[key](q, k, v, **kwargs)
        return out
    try:
        out = _flex()(q, k, v, **kwargs)
        return out
    except Exception as exc:
        from torch._inductor.exc import InductorError

        if not isinstance(exc, InductorError):
            raise
        # torch 2.13's CPU flex template sometimes emits invalid C++ when it re-specialises the
        # dynamic graph (undeclared ``cur_kvSplitSize4``); a static compile of the same shape works.
        logger.warning("dynamic flex compile failed for %s; compiling this shape statically", key)
        if key not in _static:
            from torch.nn.attention.flex_attention import flex_attention

            _static[key] = torch.compile(flex_attention, dynamic=False)
        out = _static[key](q, k, v, **kwargs)
        return out


def _kv_lists(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(num, indices) in BlockMask layout: selected block indices first, ascending, int32."""
    num = mask.sum(dim=-1, dtype=torch.int32)
    idx = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx


def build_block_mask(plan: PBSPlan) -> Any:
    """The plan as a flex ``BlockMask`` over permuted keys (see module docstring)."""
    from torch.nn.attention.flex_attention import BlockMask

    bs, n, t = plan.block_size, plan.n, plan.num_blocks
    seg = block_segments(t, plan.segment_size, bs, plan.block_mask.device)
    diagonal = (seg[None, :] == seg[:, None]).expand_as(plan.block_mask)
    full = plan.block_mask & ~diagonal
    full_num, full_idx = _kv_lists(full)
    part_num, part_idx = _kv_lists(diagonal.contiguous())
    # Pad the index map to whole blocks; padded key slots get an index no query reaches.
    perm_pad = torch.full(
        (*plan.perm.shape[:2], t * bs),
        torch.iinfo(torch.int64).max,
        dtype=torch.int64,
        device=plan.perm.device,
    )
    perm_pad[..., :n] = plan.perm
    group = plan.perm_group

    def original_causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return perm_pad[b, h // group, kv_idx] <= q_idx

    return BlockMask.from_kv_blocks(
        part_num, part_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=original_causal, seq_lengths=(n, n)
    )


def flex_pbs_attention(
    q: Tensor, k: Tensor, v: Tensor, plan: PBSPlan, *, scale: float | None = None
) -> Tensor:
    """Block-sparse causal attention for ``plan`` on CPU via compiled flex_attention."""
    k_perm, v_perm = permute_kv(k, v, plan.perm)
    work = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
    # Contiguous q: the dynamic-shape CPU template miscompiles for strided inputs (e.g. HF's transposed views).
    out = _run_flex(q.to(work).contiguous(), k_perm.to(work), v_perm.to(work), build_block_mask(plan), scale)
    return out.to(q.dtype)
