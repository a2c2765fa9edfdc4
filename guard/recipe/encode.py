"""Samples -> the monitored network's residuals -> SAE activations over each sample's scored span, stored
sparse (most latents are silent at every token). The causal norm filter is applied exactly as at serve
time, so whatever is fitted on these rows is fitted on what the stream will see."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from guard.monitor import causal_norm_mask
from guard.recipe.sources import Sample
from guard.text import GuardText, prompt_text, response_text, token_span

log = logging.getLogger(__name__)


@dataclass
class TokenData:
    """SAE activations of the scored tokens of many samples, in CSR form.

    Token rows of sample i are ``sample_ptr[i]:sample_ptr[i+1]``; row r holds the latents
    ``indices[indptr[r]:indptr[r+1]]`` with ``values`` (already zero for norm-filtered tokens)."""

    indptr: np.ndarray        # (n_tokens + 1,) int64
    indices: np.ndarray       # (nnz,) int32
    values: np.ndarray        # (nnz,) float32
    sample_ptr: np.ndarray    # (n_samples + 1,) int64
    width: int

    @property
    def n_samples(self) -> int:
        return len(self.sample_ptr) - 1

    @property
    def n_tokens(self) -> int:
        return len(self.indptr) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.sample_ptr)

    def subset(self, idx: Sequence[int]) -> TokenData:
        rows, ptr = [], [0]
        for i in idx:
            a, b = int(self.sample_ptr[i]), int(self.sample_ptr[i + 1])
            rows.append(np.arange(a, b))
            ptr.append(ptr[-1] + b - a)
        r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        starts, ends = self.indptr[r], self.indptr[r + 1]
        nnz = ends - starts
        take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)]) if len(r) else np.zeros(0, np.int64)
        return TokenData(np.concatenate([[0], np.cumsum(nnz)]).astype(np.int64), self.indices[take], self.values[take],
                         np.array(ptr, dtype=np.int64), self.width)

    def concat(self, other: TokenData) -> TokenData:
        """This data's samples followed by ``other``'s (same SAE width)."""
        if other.width != self.width:
            raise ValueError(f"cannot join token data of widths {self.width} and {other.width}")
        return TokenData(np.concatenate([self.indptr, other.indptr[1:] + self.indptr[-1]]).astype(np.int64),
                         np.concatenate([self.indices, other.indices]), np.concatenate([self.values, other.values]),
                         np.concatenate([self.sample_ptr, other.sample_ptr[1:] + self.sample_ptr[-1]]).astype(np.int64),
                         self.width)

    def save(self, path: Any) -> None:
        np.savez(path, indptr=self.indptr, indices=self.indices, values=self.values, sample_ptr=self.sample_ptr,
                 width=np.array(self.width))

    @classmethod
    def load(cls, path: Any) -> TokenData:
        z = np.load(path)
        return cls(z["indptr"], z["indices"], z["values"], z["sample_ptr"], int(z["width"]))

    def dense_rows(self, i: int, columns: Sequence[int]) -> np.ndarray:
        """Activations of sample i's tokens restricted to ``columns`` (dense, (T, len(columns)))."""
        pos = {c: k for k, c in enumerate(columns)}
        a, b = int(self.sample_ptr[i]), int(self.sample_ptr[i + 1])
        out = np.zeros((b - a, len(columns)), dtype=np.float32)
        for r in range(a, b):
            for j, v in zip(self.indices[self.indptr[r]:self.indptr[r + 1]], self.values[self.indptr[r]:self.indptr[r + 1]],
                            strict=True):
                k = pos.get(int(j))
                if k is not None:
                    out[r - a, k] = v
        return out

    def sample_max(self) -> np.ndarray:
        """(n_samples, width) max over each sample's tokens (dense; 0 where a latent never fires)."""
        X = np.zeros((self.n_samples, self.width), dtype=np.float32)
        tok_sample = np.repeat(np.arange(self.n_samples), self.lengths())
        row_of_nz = np.repeat(np.arange(self.n_tokens), np.diff(self.indptr))
        np.maximum.at(X, (tok_sample[row_of_nz], self.indices), self.values)
        return X


def guard_tokens(tok: Any, s: Sample) -> tuple[list[int], list[tuple[int, int]], tuple[int, int], GuardText]:
    """A sample's guard text (:mod:`guard.text`), its token ids and character offsets, and the scored span."""
    gt = prompt_text(s.conv) if s.response is None else response_text(s.conv, s.response)
    enc = tok(gt.text, return_offsets_mapping=True, add_special_tokens=False)
    ids, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    return ids, offs, token_span(offs, gt.char_start, gt.char_end), gt


def guard_input(tok: Any, s: Sample) -> tuple[list[int], tuple[int, int]]:
    """Token ids of a sample's guard text and the token span the gate scores."""
    ids, _, span, _ = guard_tokens(tok, s)
    return ids, span


def encode_samples(model: Any, tok: Any, saes: dict[int, Any], samples: Sequence[Sample], max_tokens: int,
                   norm_ratio: float = 10.0, batch_tokens: int = 6144) -> dict[int, TokenData]:
    """For each layer with an SAE: sparse SAE activations over every sample's scored span.

    Conversations longer than ``max_tokens`` keep their last ``max_tokens`` tokens (the guard's context
    limit at serve time); the span is clipped accordingly."""
    import torch

    from guard.recipe.sae import residuals_at

    metas = []
    for s in samples:
        ids, (a, b) = guard_input(tok, s)
        if len(ids) > max_tokens:
            drop = len(ids) - max_tokens
            ids, a, b = ids[drop:], max(0, a - drop), max(0, b - drop)
        metas.append((ids, (a, b)))
    layers = sorted(saes)
    order = sorted(range(len(samples)), key=lambda i: len(metas[i][0]))
    per: dict[int, list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]] = {layer: [] for layer in layers}
    t0 = time.time()
    i = 0
    done = 0
    while i < len(order):
        T = len(metas[order[i]][0])
        n = max(1, batch_tokens // max(T, 1))
        batch = order[i:i + n]
        T = max(len(metas[j][0]) for j in batch)
        while len(batch) > 1 and T * len(batch) > 2 * batch_tokens:
            batch = batch[:-1]
        i += len(batch)
        res = residuals_at(model, [metas[j][0] for j in batch], layers)
        for j, r in zip(batch, res, strict=True):
            a, b = metas[j][1]
            for layer in layers:
                x = r[layer].float()
                kept = causal_norm_mask(x.norm(dim=-1).numpy(), norm_ratio)
                with torch.no_grad():
                    acts = saes[layer].encode(x[a:b]).numpy() * kept[a:b, None] if b > a else np.zeros((0, 1))
                rr, cc = np.nonzero(acts)
                per[layer].append((j, rr, cc.astype(np.int32), acts[rr, cc].astype(np.float32)))
        done += len(batch)
        if done % 500 < len(batch):
            log.info("encoded %d/%d samples (%.0fs)", done, len(samples), time.time() - t0)
    out = {}
    for layer in layers:
        by = {j: (rr, cc, vv) for j, rr, cc, vv in per[layer]}
        indptr, idx, val, sptr = [0], [], [], [0]
        for j in range(len(samples)):
            a, b = metas[j][1]
            T = max(0, b - a)
            rr, cc, vv = by[j]
            counts = np.bincount(rr, minlength=T) if T else np.zeros(0, dtype=np.int64)
            indptr.extend((indptr[-1] + np.cumsum(counts)).tolist())
            idx.append(cc)
            val.append(vv)
            sptr.append(sptr[-1] + T)
        out[layer] = TokenData(np.array(indptr, dtype=np.int64), np.concatenate(idx) if idx else np.zeros(0, np.int32),
                               np.concatenate(val) if val else np.zeros(0, np.float32), np.array(sptr, dtype=np.int64),
                               int(saes[layer].cfg.d_sae))
    return out


def encode_cached(cache: Any, sae: Any, layer: int, idx: Sequence[int], norm_ratio: float = 10.0,
                  batch_rows: int = 16384) -> TokenData:
    """:func:`encode_samples` from the residual cache: SAE activations over the scored spans of the cache's
    samples ``idx`` (in that order), norm-filtered exactly as at serve time."""
    import torch

    from guard.recipe.cache import bits_to_float
    from guard.recipe.sae import cache_norms

    norms = cache_norms(cache, layer)
    arr = cache.array(layer)
    row_parts, keep_parts, sptr = [], [], [0]
    for i in idx:
        a0, n = int(cache.starts[i]), int(cache.lengths[i])
        kept = causal_norm_mask(norms[a0:a0 + n], norm_ratio)
        a, b = cache.span(i)
        row_parts.append(np.arange(a, b, dtype=np.int64) + a0)
        keep_parts.append(kept[a:b])
        sptr.append(sptr[-1] + max(0, b - a))
    # a token the filter drops stays as an empty row, so positions keep their meaning
    all_rows = np.concatenate(row_parts) if row_parts else np.zeros(0, np.int64)
    keep_set = np.concatenate(keep_parts) if keep_parts else np.zeros(0, bool)
    counts = np.zeros(len(all_rows), dtype=np.int64)
    idx_parts, val_parts = [], []
    t0 = time.time()
    with torch.no_grad():
        for a in range(0, len(all_rows), batch_rows):
            sel = np.arange(a, min(a + batch_rows, len(all_rows)))
            sel = sel[keep_set[sel]]
            if not len(sel):
                continue
            x = bits_to_float(np.asarray(arr[all_rows[sel]]))
            acts = sae.encode(x).numpy()
            rr, cc = np.nonzero(acts)
            counts[sel] = np.bincount(rr, minlength=len(sel))
            idx_parts.append(cc.astype(np.int32))
            val_parts.append(acts[rr, cc].astype(np.float32))
    log.info("encoded %d samples / %d tokens at layer %d (%.0fs)", len(idx), len(all_rows), layer, time.time() - t0)
    return TokenData(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                     np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int32),
                     np.concatenate(val_parts) if val_parts else np.zeros(0, np.float32),
                     np.array(sptr, dtype=np.int64), int(sae.cfg.d_sae))
