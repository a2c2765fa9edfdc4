"""Picking a response threshold from one greedy stream's scores so a second stream crosses it at the same place."""
from __future__ import annotations


def served_dtype() -> str:
    from guard.bundle import read_manifest
    from guard.config import DEFAULT_ARTIFACTS_DIR
    from guard.hardware import serving_dtype

    return serving_dtype(read_manifest(DEFAULT_ARTIFACTS_DIR).get("dtype", "float32"))


def score_tolerance() -> float:
    # The guard batches a stream's pending tokens per engine step, and how tokens group into steps changes the
    # GEMM shapes: in fp32 that moves a score by about 1e-6 relative, in bf16 (8-bit mantissa) by up to ~1e-2.
    return 2e-2 if served_dtype() == "bfloat16" else 1e-5


def threshold_in_gap(risks: list[float], skip: int = 3, tol: float | None = None) -> float:
    """A threshold just under the highest score after `skip` tokens, inside a gap of the scores wider than the
    served dtype's rounding, so a score moved by re-association cannot cross it in one stream and not the other."""
    tol = score_tolerance() if tol is None else tol
    levels = sorted(set(risks[skip:]), reverse=True)
    gaps = [(hi, lo) for hi, lo in zip(levels, levels[1:], strict=False) if hi - lo > 4 * tol]
    hi, lo = gaps[0] if gaps else (levels[0], levels[0] - 1.0)
    return (hi + lo) / 2
