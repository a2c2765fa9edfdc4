"""vLLM attention-backend plugin: PBS-Attn for long fresh prefills on GPU, FlashAttention for the rest.

Written against vLLM 0.32's v1 backend API (``vllm.v1.attention.backends.flash_attn``). It subclasses
FlashAttention's backend and impl; the KV-cache write (``do_kv_cache_update``) and the metadata builder
are inherited unchanged, so decode always reads a normal paged cache.

Per forward call the batch is split by :func:`split_requests`:

* **PBS** for a request iff it is a *fresh* prefill (``context_len == 0``: no prefix-cache hit and not a
  later chunk of a chunked prefill), its query length passes the length gate and ``use_dense`` says no.
  Its contiguous token slice is run through :func:`inference.pbs_attn.pbs_attention` on the K/V passed
  into ``forward`` (the same values that were written to the cache).
* **FlashAttention** for every other request (decodes, later prefill chunks, prefix-cache hits, short
  prompts), via a metadata view restricted to those requests (:func:`restrict_metadata`).

Caveats (also in README): a *first* chunk of a chunked prefill has ``context_len == 0`` and is treated
as a self-contained prefill of that chunk; the permutation then uses that chunk's last block instead of
the prompt's. Cached prefix KV produced by PBS does not depend on attention outputs, so prefix caching
stays correct; only outputs depend on the suffix (see README). CUDA graphs: long prefills are not
captured (piecewise mode runs attention eagerly), so no graph support is claimed beyond FlashAttention's.

Importing this module never imports vLLM or Triton; the backend classes are built on first attribute
access (``PBSFlashAttentionBackend``), which is how vLLM resolves a registered class path.

Enable: ``register()`` (the ``vllm.general_plugins`` entry point) registers the class under
``AttentionBackendEnum.CUSTOM``; start vLLM with ``attention_backend="CUSTOM"``. Settings come from the
environment (``NEXTGUARD_INFERENCE__PBS__THRESHOLD`` …) because vLLM workers are separate processes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

from inference.pbs_attn.config import LayerTau, PBSSettings

ENV_PREFIX = "NEXTGUARD_INFERENCE__PBS__"
CLASS_PATH = "inference.pbs_attn.vllm_backend.PBSFlashAttentionBackend"
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def settings_from_env(environ: dict[str, str] | None = None) -> PBSSettings:
    """PBSSettings from ``NEXTGUARD_INFERENCE__PBS__<FIELD>`` variables (unknown fields raise)."""
    env = os.environ if environ is None else environ
    values = {k[len(ENV_PREFIX) :].lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    return PBSSettings.model_validate(values)


def layer_index(layer_name: str) -> int | None:
    """Decoder layer index from a vLLM attention layer name (``model.layers.4.self_attn.attn`` -> 4)."""
    m = _LAYER_INDEX.search(layer_name)
    return int(m.group(1)) if m else None


def shard_threshold(tau: LayerTau, local_heads: int, tp_rank: int) -> LayerTau:
    """This worker's part of a per-head τ. Settings name every query head of the model; under tensor
    parallelism a worker holds heads ``[rank * local_heads, (rank + 1) * local_heads)``."""
    if isinstance(tau, int | float) or len(tau) == local_heads:
        return tau
    if len(tau) % local_heads or not 0 <= tp_rank < len(tau) // local_heads:
        raise ValueError(
            f"per-head τ has {len(tau)} entries; this worker (tensor-parallel rank {tp_rank}) holds "
            f"{local_heads} query heads, so the setting must name {local_heads} x tensor-parallel size heads"
        )
    return tuple(tau[tp_rank * local_heads : (tp_rank + 1) * local_heads])


@dataclasses.dataclass(frozen=True)
class BatchSplit:
    """Request indices of one vLLM step: which run PBS and which stay on FlashAttention."""

    pbs: list[int]
    dense: list[int]


def split_requests(
    query_start_loc: Sequence[int], seq_lens: Sequence[int], settings: PBSSettings, layer_idx: int | None = None
) -> BatchSplit:
    """Decide per request; ``query_start_loc`` has ``num_reqs + 1`` entries (CPU ints). A request whose τ
    for ``layer_idx`` at its length is >= 1 (its length bucket makes the layer dense) stays on the stock kernel."""
    from inference.pbs_attn.api import use_dense

    pbs: list[int] = []
    dense: list[int] = []
    for i, seq_len in enumerate(seq_lens):
        q_len = int(query_start_loc[i + 1]) - int(query_start_loc[i])
        fresh = q_len == int(seq_len) and q_len > 1  # context_len == 0
        ok = (
            settings.enabled
            and fresh
            and not use_dense(
                q_len,
                threshold=settings.threshold_for(layer_idx, q_len),
                segment_size=settings.segment_size,
                min_len=settings.min_len,
            )
        )
        (pbs if ok else dense).append(i)
    return BatchSplit(pbs=pbs, dense=dense)


def restrict_metadata(meta: Any, keep: Sequence[int]) -> tuple[Any, Any]:
    """FlashAttention metadata for the requests ``keep`` only, and the token indices they own.

    Query tokens of the kept requests are packed in order; ``query_start_loc`` is rebuilt for the packed
    layout, ``seq_lens``/``block_table`` rows are selected, and the AOT scheduler metadata is dropped
    (it was planned for the full batch).
    """
    import torch

    qsl = meta.query_start_loc
    keep_t = torch.as_tensor(list(keep), dtype=torch.long, device=qsl.device)
    starts, ends = qsl[:-1][keep_t], qsl[1:][keep_t]
    lens = ends - starts
    token_idx = torch.cat(
        [torch.arange(int(s), int(e), device=qsl.device) for s, e in zip(starts, ends, strict=True)]
    )
    new_qsl = torch.zeros(len(keep) + 1, dtype=qsl.dtype, device=qsl.device)
    new_qsl[1:] = lens.cumsum(0)
    seq_lens = meta.seq_lens[keep_t]
    restricted = dataclasses.replace(
        meta,
        num_actual_tokens=int(lens.sum()),
        max_query_len=int(lens.max()),
        query_start_loc=new_qsl,
        max_seq_len=int(seq_lens.max()),
        seq_lens=seq_lens,
        block_table=meta.block_table[keep_t],
        slot_mapping=meta.slot_mapping[token_idx],
        scheduler_metadata=None,
        max_num_splits=0,
    )
    return restricted, token_idx


def register() -> None:
    """``vllm.general_plugins`` entry point: make PBS selectable as ``attention_backend="CUSTOM"``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, CLASS_PATH)


def _build_classes() -> dict[str, type]:
    import torch
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

    from inference.pbs_attn.api import pbs_attention

    settings = settings_from_env()

    class PBSFlashAttentionImpl(FlashAttentionImpl):  # type: ignore[misc]
        def forward(  # type: ignore[override]
            self,
            layer: torch.nn.Module,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            kv_cache: torch.Tensor,
            attn_metadata: Any,
            output: torch.Tensor,
            output_scale: torch.Tensor | None = None,
            output_block_scale: torch.Tensor | None = None,
        ) -> torch.Tensor:
            layer_idx = layer_index(getattr(layer, "layer_name", ""))
            usable = (
                attn_metadata is not None
                and settings.layer_enabled(layer_idx)
                and self.sliding_window in (None, (-1, -1))
                and not self.logits_soft_cap
                and self.alibi_slopes is None
                and attn_metadata.causal is True
                and self.dcp_world_size == 1
            )
            if not usable:
                return super().forward(
                    layer,
                    query,
                    key,
                    value,
                    kv_cache,
                    attn_metadata,
                    output,
                    output_scale,
                    output_block_scale,
                )
            qsl = attn_metadata.query_start_loc.tolist()
            split = split_requests(qsl, attn_metadata.seq_lens.tolist(), settings, layer_idx)
            if not split.pbs:
                return super().forward(
                    layer,
                    query,
                    key,
                    value,
                    kv_cache,
                    attn_metadata,
                    output,
                    output_scale,
                    output_block_scale,
                )
            out3 = output.view(output.shape[0], self.num_heads, self.head_size)
            for i in split.pbs:
                s, e = qsl[i], qsl[i + 1]
                # (tokens, heads, d) -> (1, heads, tokens, d): strided views, no copy of the prompt.
                q = query[s:e].transpose(0, 1).unsqueeze(0)
                k = key[s:e].transpose(0, 1).unsqueeze(0)
                v = value[s:e].transpose(0, 1).unsqueeze(0)
                o = pbs_attention(
                    q,
                    k,
                    v,
                    threshold=shard_threshold(
                        settings.threshold_for(layer_idx, e - s), self.num_heads, get_tensor_model_parallel_rank()
                    ),
                    segment_size=settings.segment_size,
                    block_size=settings.block_size,
                    gqa=settings.gqa,
                    scale=self.scale,
                )
                out3[s:e] = o[0].transpose(0, 1).to(output.dtype)
            if split.dense:
                meta, idx = restrict_metadata(attn_metadata, split.dense)
                sub_out = output[idx]
                super().forward(
                    layer,
                    query[idx],
                    key[idx],
                    value[idx],
                    kv_cache,
                    meta,
                    sub_out,
                    output_scale,
                    output_block_scale,
                )
                output[idx] = sub_out
            return output

    class PBSFlashAttentionBackend(FlashAttentionBackend):  # type: ignore[misc]
        @staticmethod
        def get_name() -> str:
            return "CUSTOM"

        @staticmethod
        def get_impl_cls() -> type[FlashAttentionImpl]:
            return PBSFlashAttentionImpl

    return {
        "PBSFlashAttentionBackend": PBSFlashAttentionBackend,
        "PBSFlashAttentionImpl": PBSFlashAttentionImpl,
    }


_classes: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name in ("PBSFlashAttentionBackend", "PBSFlashAttentionImpl"):
        if not _classes:
            _classes.update(_build_classes())
        return _classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
