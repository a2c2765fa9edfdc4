"""What the CPU does natively: the build and the runner pick their arithmetic from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inference.hardware import native_bf16

__all__ = ["build_dtype", "cpu_features", "native_bf16", "preferred_dtype", "serving_dtype"]


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
    """The dtype the served guard runs in unless the operator sets one: fp32. In bf16 a token's score moves
    with the batch it shares a step with (measured on a served stream: up to 0.25 relative, enough to move a
    cut), and a safety decision should not depend on which other streams are running; fp32 reproduces a
    bf16-fitted monitor's scores within its rounding. bf16 is the faster opt-in where it is native."""
    return "float32"


def build_dtype(fitted: str) -> str:
    """The dtype offline work (the residual cache, the ladder) runs in: the build's, where it is native."""
    return "bfloat16" if fitted == "bfloat16" and native_bf16() else "float32"
