"""What the CPU does natively: the build and the runner pick their arithmetic from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def native_bf16() -> bool:
    """True where bf16 matmuls run natively (AVX512-BF16 or AMX on x86, any CUDA device).

    Elsewhere bf16 is emulated and several times slower than fp32, so the build and the runner use fp32."""
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


def preferred_dtype() -> str:
    return "bfloat16" if native_bf16() else "float32"


def cpu_features() -> dict[str, Any]:
    """What the build's provenance records about the machine's arithmetic."""
    import torch

    out: dict[str, Any] = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": native_bf16()}
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
        out["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return out


def serving_dtype(fitted: str) -> str:
    """The dtype to run a monitor fitted in ``fitted``: bf16 only where it is native (emulated bf16 is
    several times slower than fp32, and fp32 reproduces bf16-fitted scores within rounding)."""
    if fitted == "bfloat16" and not native_bf16():
        return "float32"
    return fitted
