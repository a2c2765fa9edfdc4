"""What the machine computes natively: the engine and the guard pick their arithmetic from it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

DType = Literal["auto", "float32", "bfloat16", "float16"]


def native_bf16() -> bool:
    """True where bf16 matmuls run natively (AVX512-BF16 or AMX on x86, any CUDA device).

    Elsewhere bf16 is emulated and several times slower than fp32 (measured on a 2-core AVX2 CPU: vLLM
    decoding the embedded model 2.7x slower in bf16), so fp32 is used there."""
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def engine_dtype(requested: DType) -> DType:
    """The dtype handed to vLLM. ``auto`` lets vLLM choose, which on a CPU means bf16 for an fp32 checkpoint
    even where bf16 is emulated; there ``auto`` means fp32 instead. An explicit dtype is kept."""
    if requested == "auto" and not native_bf16():
        return "float32"
    return requested
