"""Permuted Block-Sparse Attention (PBS-Attn, arXiv 2510.21270) for long causal prefills.

``inference.pbs_attn.pbs_attention(q, k, v, *, threshold=0.9, segment_size=256, block_size=128)``
is the public function. Torch is imported on first attribute access, so importing this package
(e.g. for :class:`PBSSettings`) stays cheap; Triton only when the Triton path runs.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "pbs_attention": "inference.pbs_attn.api",
    "pbs_attention_with_plan": "inference.pbs_attn.api",
    "make_plan": "inference.pbs_attn.algorithm",
    "PBSPlan": "inference.pbs_attn.algorithm",
    "pbs_reference": "inference.pbs_attn.reference",
    "PBSSettings": "inference.pbs_attn.config",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'inference.pbs_attn' has no attribute {name!r}")
