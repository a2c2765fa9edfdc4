"""PBS-Attn as a transformers attention implementation (prefill only; decode unchanged).

``register_hf_attention(settings)`` adds ``"pbs"`` to transformers' ``AttentionInterface`` (and the
SDPA mask builder under the same name), after which any model loads with
``from_pretrained(..., attn_implementation="pbs")`` or switches with ``model.set_attn_implementation("pbs")``.

A call takes the PBS path only for a fresh causal prefill: ``q_len == kv_len > 1`` (no cached prefix),
no padding mask, no sliding window, and ``not use_dense(...)`` (τ < 1, ``N >= min_len``, ``N > S``).
Everything else -- decode steps, prefill on top of a cache, padded batches -- goes to transformers' own
SDPA function unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inference.pbs_attn.config import PBSSettings

_registered: dict[str, PBSSettings] = {}


@dataclass
class HFCallStats:
    """How many attention calls took each path (per process, for tests and the benchmark)."""

    pbs: int = 0
    dense: int = 0

    def reset(self) -> None:
        self.pbs = 0
        self.dense = 0


stats = HFCallStats()


def make_attention_fn(settings: PBSSettings) -> Callable[..., Any]:
    """The attention function transformers calls: ``(module, q, k, v, mask, ...) -> (out (B,N,H,D), None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from inference.pbs_attn.api import pbs_attention, use_dense

    def pbs_attention_forward(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[Any, None]:
        n = query.shape[2]
        fresh_prefill = n > 1 and key.shape[2] == n
        tau = settings.threshold_for(getattr(module, "layer_idx", None), n)
        eligible = (
            fresh_prefill
            and attention_mask is None
            and getattr(module, "is_causal", True)
            and kwargs.get("sliding_window") is None
            and getattr(module, "sliding_window", None) is None
            and (dropout == 0.0 or not module.training)
            and not use_dense(n, threshold=tau, segment_size=settings.segment_size, min_len=settings.min_len)
        )
        if not eligible:
            stats.dense += 1
            out: tuple[Any, None] = sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
            return out
        stats.pbs += 1
        attn = pbs_attention(
            query,
            key,
            value,
            threshold=tau,
            segment_size=settings.segment_size,
            block_size=settings.block_size,
            gqa=settings.gqa,
            scale=scaling,
        )
        return attn.transpose(1, 2).contiguous(), None

    return pbs_attention_forward


def register_hf_attention(settings: PBSSettings | None = None, name: str = "pbs") -> str:
    """Register PBS under ``name`` in transformers; returns the name to pass as ``attn_implementation``.

    Registering the same name again with the same settings is a no-op; with different settings, or over a
    name transformers already owns, it raises (pick another ``name``).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    settings = settings or PBSSettings(attention="pbs")
    if name in _registered:
        if _registered[name] == settings:
            return name
        raise ValueError(
            f"attention implementation {name!r} is already registered with {_registered[name]!r}; "
            "use another name for different settings"
        )
    if name in AttentionInterface._global_mapping:
        raise ValueError(f"{name!r} is a transformers attention implementation already; choose another name")
    AttentionInterface.register(name, make_attention_fn(settings))
    # Same masks as SDPA: None for unpadded causal prefill (our eligibility test relies on that).
    AttentionMaskInterface.register(name, sdpa_mask)
    _registered[name] = settings
    return name
