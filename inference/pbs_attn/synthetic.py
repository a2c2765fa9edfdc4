"""Planted heavy-hitter Q/K/V: attention maps with the structure PBS is designed for.

Random Gaussian Q/K give near-uniform block scores, so τ=0.9 selects every block and tests nothing.
Here a few "heavy hitter" keys per KV head share a direction with every query (vertical lines in the
attention map), scattered uniformly so that *without* permutation nearly every key block holds one,
plus a smooth local component (a random walk shared by queries and keys) that gives the diagonal
band. Used by the tests and by the benchmark's synthetic density/recall curves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def heavy_hitter_qkv(
    batch: int,
    q_heads: int,
    kv_heads: int,
    n: int,
    head_dim: int,
    *,
    heavy_fraction: float = 0.02,
    heavy_logit: float = 6.0,
    local_strength: float = 0.6,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor, Tensor]:
    """Return q (batch, q_heads, n, d) and k, v (batch, kv_heads, n, d).

    ``heavy_logit`` is the approximate logit boost of a heavy-hitter key for every query; with the
    default 2 % heavy keys these carry most of the attention mass at 4K-32K.
    """
    g = torch.Generator().manual_seed(seed)
    group = q_heads // kv_heads
    d = head_dim
    q = torch.randn(batch, q_heads, n, d, generator=g)
    k = torch.randn(batch, kv_heads, n, d, generator=g)
    v = torch.randn(batch, kv_heads, n, d, generator=g)
    # One unit "sink" direction per KV head, shared by its query heads.
    u = torch.nn.functional.normalize(torch.randn(batch, kv_heads, 1, d, generator=g), dim=-1)
    a = math.sqrt(heavy_logit) * d**0.25  # q.u * k.u / sqrt(d) = heavy_logit
    q = q + a * u.repeat_interleave(group, dim=1)
    heavy = torch.rand(batch, kv_heads, n, 1, generator=g) < heavy_fraction
    heavy[:, :, 0] = True  # position 0 acts as the attention sink
    k = k + heavy * a * u
    # Local band: queries and keys share a slowly varying random walk.
    steps = torch.randn(batch, kv_heads, n, d, generator=g) / math.sqrt(64.0)
    walk = torch.nn.functional.normalize(steps.cumsum(dim=2), dim=-1) * math.sqrt(d) * local_strength
    q = q + walk.repeat_interleave(group, dim=1)
    k = k + walk
    return q.to(dtype), k.to(dtype), v.to(dtype)
