"""The engine's dtype follows what the CPU computes natively: ``auto`` never means emulated bf16."""

from __future__ import annotations

import pytest

import inference.hardware as hw


@pytest.mark.parametrize(("native", "requested", "expected"), [
    (False, "auto", "float32"),           # AVX2-only CPU: vLLM's auto would pick emulated bf16
    (True, "auto", "auto"),               # AVX512-BF16 / AMX / GPU: vLLM's own choice
    (False, "bfloat16", "bfloat16"),      # an operator's explicit choice is kept
    (True, "float32", "float32"),
    (False, "float16", "float16"),
])
def test_engine_dtype(monkeypatch: pytest.MonkeyPatch, native: bool, requested: str, expected: str) -> None:
    monkeypatch.setattr(hw, "native_bf16", lambda: native)
    assert hw.engine_dtype(requested) == expected


def test_native_bf16_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    real = hw.Path
    for flags, expected in (("fpu avx2 fma", False), ("fpu avx512f avx512_bf16", True), ("fpu amx_bf16 amx_tile", True)):
        f = tmp_path / "cpuinfo"
        f.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(hw, "Path", lambda p, f=f: f if p == "/proc/cpuinfo" else real(p))
        assert hw.native_bf16() is expected, flags
