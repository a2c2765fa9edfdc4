"""One forward of the monitored network per token per build: the residual cache.

Every sample's guard text goes through the safeguard once, up to the deepest candidate layer, and the
residual stream after each candidate layer is kept on local disk (raw bf16 bits, ~1.2 kB per token and
layer). SAE training, encoding, read-out fitting, the dense probes and the held-out SAE numbers all read
these rows instead of running the model again.

Batches are length-sorted: each holds sequences of (nearly) one length, so almost nothing is padded, and
each sequence is its own row, so no token attends across documents. Padding is on the right, which a
causal model never reads. The share of computed tokens that are real is recorded.

The cache is written in batch order with a progress file, so an interrupted build resumes where it
stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guard.recipe.sources import Sample

log = logging.getLogger(__name__)


@dataclass
class Row:
    """Where one sample's tokens sit in the cache and which of them the gate scores."""

    start: int
    length: int
    span: tuple[int, int]


class ResidualCache:
    """Read side of a cache folder: ``meta.json`` + one ``layer{L}.bin`` (uint16 bf16 bits, (N, d))."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = json.loads((self.root / "meta.json").read_text())
        self.layers: list[int] = list(self.meta["layers"])
        self.d = int(self.meta["d_model"])
        self.n_tokens = int(self.meta["n_tokens"])
        self.keys: list[str] = list(self.meta["keys"])
        z = np.load(self.root / "rows.npz")
        self.starts, self.lengths, self.spans = z["starts"], z["lengths"], z["spans"]
        self._index = {k: i for i, k in enumerate(self.keys)}
        self._arrays: dict[int, np.ndarray] = {}

    @property
    def complete(self) -> bool:
        return bool(json.loads((self.root / "progress.json").read_text()).get("complete"))

    def index(self, s: Sample) -> int:
        return self._index[s.key()]

    def array(self, layer: int) -> np.ndarray:
        """The layer's rows as a read-only uint16 memmap (bf16 bits)."""
        if layer not in self._arrays:
            self._arrays[layer] = np.memmap(self.root / f"layer{layer}.bin", dtype=np.uint16, mode="r",
                                            shape=(self.n_tokens, self.d))
        return self._arrays[layer]

    def rows(self, layer: int, i: int) -> Any:
        """Sample i's residuals at ``layer`` as a float32 tensor (T, d)."""
        a, n = int(self.starts[i]), int(self.lengths[i])
        return bits_to_float(np.asarray(self.array(layer)[a:a + n]))

    def span(self, i: int) -> tuple[int, int]:
        return int(self.spans[i, 0]), int(self.spans[i, 1])


def bits_to_float(bits: np.ndarray) -> Any:
    """uint16 bf16 bits -> float32 tensor."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).float()


def float_to_bits(x: Any) -> np.ndarray:
    import torch

    return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def length_batches(lengths: Sequence[int], batch_tokens: int, slack: float = 0.06) -> list[list[int]]:
    """Indices grouped into batches of nearly equal length: ascending by length, a batch closes when one
    more sequence would exceed ``batch_tokens`` computed tokens or be more than ``slack`` longer than the
    batch's first (so at most ~``slack`` of a batch is padding)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        n = lengths[i]
        if cur:
            first = lengths[cur[0]]
            if (len(cur) + 1) * n > batch_tokens or n > first * (1 + slack) + 2:
                out.append(cur)
                cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def sample_tokens(tok: Any, s: Sample, max_tokens: int) -> tuple[list[int], tuple[int, int]]:
    """A sample's guard-text ids (the last ``max_tokens`` of them, as the serve-time context limit keeps)
    and the scored span within them."""
    from guard.recipe.encode import guard_input

    ids, (a, b) = guard_input(tok, s)
    if len(ids) > max_tokens:
        drop = len(ids) - max_tokens
        ids, a, b = ids[drop:], max(0, a - drop), max(0, b - drop)
    return ids, (a, b)


def cache_key(model_id: str, samples: Sequence[Sample], layers: Sequence[int], max_tokens: int, dtype: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([model_id, list(layers), max_tokens, dtype]).encode())
    for s in samples:
        h.update(s.key().encode())
    return h.hexdigest()[:16]


def build_cache(model: Any, tok: Any, samples: Sequence[Sample], layers: Sequence[int], root: Path, *,
                model_id: str, max_tokens: int = 2048, batch_tokens: int = 8192, dtype: str = "float32",
                progress: Any = None) -> ResidualCache:
    """Run every sample once through ``model`` up to ``max(layers)`` and store the residuals.

    ``root`` is created (or resumed, when its ``meta.json`` carries the same key). ``progress`` is called
    as ``progress(done_tokens, total_tokens)`` after each batch."""
    from guard.recipe.sae import residuals_at

    root = Path(root)
    layers = sorted(set(layers))
    key = cache_key(model_id, samples, layers, max_tokens, dtype)
    meta_path, prog_path = root / "meta.json", root / "progress.json"
    toks = [sample_tokens(tok, s, max_tokens) for s in samples]
    lengths = [len(ids) for ids, _ in toks]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    n_tokens = int(sum(lengths))
    d = int(model.config.hidden_size)
    batches = length_batches(lengths, batch_tokens)
    fresh = not (meta_path.is_file() and json.loads(meta_path.read_text()).get("key") == key)
    if fresh:
        root.mkdir(parents=True, exist_ok=True)
        for p in root.glob("layer*.bin"):
            p.unlink()
        for layer in layers:
            np.memmap(root / f"layer{layer}.bin", dtype=np.uint16, mode="w+", shape=(n_tokens, d)).flush()
        np.savez(root / "rows.npz", starts=starts, lengths=np.array(lengths, dtype=np.int64),
                 spans=np.array([sp for _, sp in toks], dtype=np.int64).reshape(-1, 2))
        prog_path.write_text(json.dumps({"done": 0, "complete": False}))
        meta_path.write_text(json.dumps({"key": key, "model": model_id, "layers": layers, "d_model": d,
                                         "n_tokens": n_tokens, "max_tokens": max_tokens, "dtype": dtype,
                                         "keys": [s.key() for s in samples]}))
    prog = json.loads(prog_path.read_text())
    if prog.get("complete"):
        return ResidualCache(root)
    arrays = {layer: np.memmap(root / f"layer{layer}.bin", dtype=np.uint16, mode="r+", shape=(n_tokens, d))
              for layer in layers}
    done_batches = int(prog["done"])
    done_tok = sum(lengths[i] for b in batches[:done_batches] for i in b)
    computed = int(prog.get("computed", 0))
    t0, last_save = time.time(), time.time()
    tok0 = done_tok
    for bi in range(done_batches, len(batches)):
        b = batches[bi]
        res = residuals_at(model, [toks[i][0] for i in b], layers)
        computed += len(b) * max(lengths[i] for i in b)
        for i, r in zip(b, res, strict=True):
            a = int(starts[i])
            for layer in layers:
                arrays[layer][a:a + lengths[i]] = float_to_bits(r[layer])
            done_tok += lengths[i]
        if progress is not None:
            progress(done_tok, n_tokens)
        now = time.time()
        if now - last_save > 60 or bi == len(batches) - 1:
            for arr in arrays.values():
                arr.flush()
            prog = {"done": bi + 1, "computed": computed, "complete": bi == len(batches) - 1}
            prog_path.write_text(json.dumps(prog))
            rate = (done_tok - tok0) / max(now - t0, 1e-9)
            log.info("residual cache %s: %d/%d tokens, %.0f tok/s, ETA %.0f s", root.name, done_tok, n_tokens, rate,
                     (n_tokens - done_tok) / max(rate, 1e-9))
            last_save = now
    real = n_tokens / max(computed, 1) if computed else 1.0
    meta = json.loads(meta_path.read_text())
    meta["real_token_share"] = real
    meta["seconds"] = meta.get("seconds", 0.0) + (time.time() - t0)
    meta_path.write_text(json.dumps(meta))
    prog_path.write_text(json.dumps({"done": len(batches), "computed": computed, "complete": True}))
    return ResidualCache(root)
