"""Triton PBS kernel: Triton-interpreter runs on CPU (always) and GPU runs (marked ``gpu``).

Triton reads ``TRITON_INTERPRET`` when it is first imported, and other tests in this process may have
imported it already (torch.compile does), so the interpreter cases run in one child process that sets
it first and reports its measurements as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.inference.pbs_tolerances import FP32_ATOL, INTERP_FP16_ATOL, LOWP_FLOOR, RATIO

ROOT = Path(__file__).resolve().parents[2]

# (batch, q_heads, kv_heads, n, head_dim, dtype, gqa, threshold) -- small: the interpreter is ~1 s per
# 600 x 2 heads; lengths cover one segment + tail, ragged tails and a non-multiple of the block size.
CASES = [
    (1, 2, 1, 300, 64, "float32", "shared", 0.8),
    (2, 2, 2, 97 + 512, 64, "float32", "shared", 0.7),
    (1, 2, 1, 600, 128, "float16", "shared", 0.8),
    (1, 2, 1, 511, 64, "float16", "replicated", 0.8),
    (1, 2, 1, 600, 64, "bfloat16", "shared", 0.8),
]

CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    from inference.pbs_attn import make_plan
    from inference.pbs_attn.algorithm import token_key_mask
    from inference.pbs_attn.reference import pbs_reference
    from inference.pbs_attn.synthetic import heavy_hitter_qkv
    from inference.pbs_attn.triton_kernel import triton_pbs_attention

    results = []
    for b, hq, hkv, n, d, dt, gqa, tau in json.loads(sys.argv[1]):
        dtype = getattr(torch, dt)
        q, k, v = heavy_hitter_qkv(b, hq, hkv, n, d, seed=n + d, dtype=dtype)
        plan = make_plan(q, k, threshold=tau, gqa=gqa)
        out = triton_pbs_attention(q, k, v, plan, block_m=64, block_n=64)
        ref = pbs_reference(q, k, v, plan)
        mask = token_key_mask(plan)
        g = hq // hkv
        torch_lowp = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask)
        # Causality: finite sentinels in future V must not move outputs at or before t.
        t = n // 2
        v2 = v.clone(); v2[:, :, t + 1:] = 1e4
        out2 = triton_pbs_attention(q, k, v2, plan, block_m=64, block_n=64)
        results.append({
            "err": (out.double() - ref).abs().max().item(),
            "torch_err": (torch_lowp.double() - ref).abs().max().item(),
            "causal_diff": (out2[:, :, : t + 1].double() - out[:, :, : t + 1].double()).abs().max().item(),
            "future_diff": (out2[:, :, t + 1:].double() - out[:, :, t + 1:].double()).abs().max().item(),
            "skipped": int((~plan.block_mask).sum()),
            "dtype_ok": out.dtype == dtype,
        })
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def interpreter_results() -> list[dict[str, float]]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CASES)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: list[dict[str, float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[3]}-{c[4]}-{c[5]}-{c[6]}" for c in CASES])
def test_triton_interpreter_matches_reference(interpreter_results: list[dict[str, float]], case: int) -> None:
    dtype = CASES[case][5]
    r = interpreter_results[case]
    assert r["dtype_ok"]
    assert r["skipped"] > 0  # planted data: the kernel really skipped tiles
    if dtype == "float32":
        assert r["err"] <= FP32_ATOL, r
    elif dtype == "float16":
        assert r["err"] <= INTERP_FP16_ATOL, r
        assert r["err"] <= RATIO * r["torch_err"] + LOWP_FLOOR[torch.float16], r
    else:  # bf16 tiles are upcast in the interpreter; only the output store rounds to bf16
        assert r["err"] <= RATIO * r["torch_err"] + LOWP_FLOOR[torch.bfloat16], r
    assert r["causal_diff"] <= (FP32_ATOL if dtype == "float32" else 1e-6), r
    assert r["future_diff"] > 1.0


def test_triton_is_not_imported_by_the_cpu_path() -> None:
    code = (
        "import sys, torch\n"
        "from inference.pbs_attn import pbs_attention\n"
        "q = torch.randn(1, 2, 300, 64)\n"
        "pbs_attention(q, q[:, :1], q[:, :1], threshold=1.0)\n"
        "import inference.pbs_attn.hf, inference.pbs_attn.vllm_backend, inference.pbs_attn.config\n"
        "print('triton' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


GPU = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the compiled Triton kernel runs only on GPU"
)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1025, 4096, 16384])
def test_gpu_kernel_error_within_twice_torch_error(dtype: torch.dtype, n: int) -> None:
    from inference.pbs_attn import make_plan
    from inference.pbs_attn.algorithm import token_key_mask
    from inference.pbs_attn.reference import pbs_reference
    from inference.pbs_attn.synthetic import heavy_hitter_qkv
    from inference.pbs_attn.triton_kernel import triton_pbs_attention

    q, k, v = (x.cuda() for x in heavy_hitter_qkv(1, 4, 2, n, 128, seed=n, dtype=dtype))
    plan = make_plan(q, k, threshold=0.9)
    out = triton_pbs_attention(q, k, v, plan)
    if n <= 4096:
        ref = pbs_reference(q, k, v, plan)
        mask = token_key_mask(plan)
        lowp = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask
        )
        err = (out.double() - ref).abs().max().item()
        base = (lowp.double() - ref).abs().max().item()
        assert err <= RATIO * base + LOWP_FLOOR[dtype], (err, base)
    else:  # the fp64 oracle is O(N^2) memory; compare with the fp32 run of the same kernel instead
        out32 = triton_pbs_attention(q.float(), k.float(), v.float(), plan)
        assert (out.float() - out32).abs().max().item() <= 2e-2
    assert torch.isfinite(out).all()
