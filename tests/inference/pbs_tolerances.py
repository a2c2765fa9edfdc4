"""Tolerances for PBS-Attn kernel tests, in one place.

fp32 paths are compared to the fp64 oracle with absolute/relative tolerances. Low-precision paths follow
FlashAttention's rule: the kernel's error against the fp64 oracle must be at most ``RATIO`` times the
error of plain PyTorch computing the same masked attention in the same dtype, plus a small floor.
"""

from __future__ import annotations

import torch

FP32_ATOL = 2e-5
FP32_RTOL = 1e-5
RATIO = 2.0
LOWP_FLOOR = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
# Triton-interpreter fp16: tl.dot takes fp16 P and V like the GPU kernel; absolute bound from the
# reference note's probe (7.4e-4 at N=1500) with headroom.
INTERP_FP16_ATOL = 4e-3
