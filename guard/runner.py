"""The safeguard's truncated forward with its own slot KV cache: every active stream in one batch.

Why not ``model(..., past_key_values=...)``: HF caches are per batch; streams join and leave at any
step and have different lengths, so batching them through HF means re-padding and copying every
cache each step. Here each stream owns a *slot* of a preallocated per-layer cache
(slots x kv_heads x max_len x head_dim) and a step runs the decoder layers 0..L once for all
streams: their new tokens packed into one sequence for the projections and MLPs, attention per group of
rows of similar lengths with ragged new-token counts handled by an explicit mask:

    slot b, query q (absolute position len_b + q) may attend key j  iff  j <= len_b + q
    padded queries (q >= n_b) attend only key 0 and their outputs are discarded

Only layers <= L run (the monitor reads the residual stream after layer L, "resid_post"), and no
final norm / LM head is computed. The decoder layers' own weights are used (after merging a LoRA
adapter into them), so this is the same network as the HF module; a test checks it against HF's
hidden states. Supported: Llama-family decoders (Llama, SmolLM, Mistral, Qwen2, Qwen3 with q/k
norms). Other architectures (Gemma2's soft-capping and sliding windows) go through
:class:`HFRunner`, which is exact but steps streams one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def load_guard_model(
    base: str | Path, adapter: str | Path | None = None, dtype: str = "float32", device: str = "cpu",
) -> tuple[Any, Any]:
    """Load the monitored model (base folder + optional LoRA adapter merged in) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tdt = getattr(torch, dtype)
    # merge the adapter in fp32, then cast: merging into bf16 weights would round the small LoRA update away
    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    model = model.to(device=device, dtype=tdt).eval()
    tok = AutoTokenizer.from_pretrained(str(base))
    return model, tok


def decoder_layers(model: Any) -> Any:
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers"):
        raise ValueError(f"{type(model).__name__} has no .model.layers; not a decoder-only HF model")
    return inner.layers


@dataclass
class _Slot:
    length: int = 0
    active: bool = False


class SlotRunner:
    """Batched incremental forward of decoder layers 0..layer for many streams (Llama family)."""

    def __init__(self, model: Any, layer: int, max_slots: int = 16, max_len: int = 4096,
                 init_len: int = 256) -> None:
        import torch

        cfg = model.config
        mt = str(getattr(cfg, "model_type", ""))
        if mt not in _LLAMA_FAMILY:
            raise ValueError(f"SlotRunner supports {_LLAMA_FAMILY}; got model_type '{mt}'. Use HFRunner.")
        n_layers = int(cfg.num_hidden_layers)
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} outside 0..{n_layers - 1}")
        self.model = model
        self.layer = layer
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.layers = list(inner.layers[: layer + 1])
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.d_model = int(cfg.hidden_size)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.max_slots, self.max_len = max_slots, max_len
        self._cap = min(init_len, max_len)
        shape = (max_slots, self.n_kv, self._cap, self.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.slots = [_Slot() for _ in range(max_slots)]

    # -- slot management --------------------------------------------------------------------------
    def alloc(self) -> int:
        for i, s in enumerate(self.slots):
            if not s.active:
                s.active, s.length = True, 0
                return i
        raise RuntimeError(f"all {self.max_slots} guard slots are busy")

    def free(self, slot: int) -> None:
        self.slots[slot] = _Slot()

    def length(self, slot: int) -> int:
        return self.slots[slot].length

    def truncate(self, slot: int, n: int) -> None:
        """Forget the slot's last ``n`` tokens (their keys and values are overwritten by the next step)."""
        s = self.slots[slot]
        if not 0 <= n <= s.length:
            raise ValueError(f"cannot drop {n} of slot {slot}'s {s.length} tokens")
        s.length -= n

    @property
    def n_active(self) -> int:
        return sum(s.active for s in self.slots)

    def export_prefix(self, slot: int, n: int) -> list[tuple[Any, Any]]:
        """A copy of the keys and values of the slot's first ``n`` tokens, per layer."""
        if not 0 < n <= self.slots[slot].length:
            raise ValueError(f"slot {slot} holds {self.slots[slot].length} tokens, not {n}")
        return [(k[slot, :, :n].clone(), v[slot, :, :n].clone()) for k, v in zip(self.k, self.v, strict=True)]

    def import_prefix(self, slot: int, kv: list[tuple[Any, Any]], n: int) -> None:
        """Start an empty slot with the first ``n`` tokens of an exported prefix: the model is causal, so
        their keys and values are the same whatever follows them."""
        if self.slots[slot].length:
            raise ValueError(f"slot {slot} is not empty")
        self._grow(n)
        for li, (k, v) in enumerate(kv):
            self.k[li][slot, :, :n] = k[:, :n]
            self.v[li][slot, :, :n] = v[:, :n]
        self.slots[slot].length = n

    def _grow(self, need: int) -> None:
        import torch

        if need <= self._cap:
            return
        if need > self.max_len:
            raise ValueError(f"guard context {need} exceeds max_len {self.max_len}")
        cap = min(self.max_len, max(need, 2 * self._cap))
        for lst in (self.k, self.v):
            for i, t in enumerate(lst):
                nt = torch.zeros((*t.shape[:2], cap, t.shape[3]), dtype=t.dtype, device=t.device)
                nt[:, :, : self._cap] = t
                lst[i] = nt
        self._cap = cap

    # -- the forward ------------------------------------------------------------------------------
    def step(self, batch: Sequence[tuple[int, Sequence[int]]]) -> list[Any]:
        """Feed new tokens to several slots at once; returns per slot the (n_new, d_model) residual
        after layer ``self.layer`` (float32, CPU).

        Every row's new tokens go through the projections and MLPs packed into one sequence, without
        padding: at a few tokens per row a forward's cost is mostly reading the weights, so one pass for
        the whole step costs far less than one per group of rows. Only attention, which mixes a row's
        tokens with its own cache, runs per group of rows of similar lengths (``_length_groups``), padded
        to the group's longest row."""
        rows = [(s, list(ids)) for s, ids in batch if len(ids)]
        if not rows:
            return []
        return self._step_packed(rows)

    def _step_packed(self, batch: list[tuple[int, list[int]]]) -> list[Any]:
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        dev = self.device
        ns = [len(ids) for _, ids in batch]
        lens = [self.slots[s].length for s, _ in batch]
        starts = [0]
        for n in ns:
            starts.append(starts[-1] + n)
        N = starts[-1]
        self._grow(max(ln + n for ln, n in zip(lens, ns, strict=True)))
        ids = torch.tensor([t for _, tok in batch for t in tok], dtype=torch.long, device=dev)[None]
        pos = torch.cat([torch.arange(ln, ln + n) for ln, n in zip(lens, ns, strict=True)]).to(dev)[None]
        groups = [self._attention_group(g, batch, ns, lens, starts) for g in _length_groups(ns)]
        with torch.inference_mode():
            x = self.embed(ids)                                   # (1, N, d)
            cos, sin = self.rotary(x, pos)
            for li, layer in enumerate(self.layers):
                attn = layer.self_attn
                h = layer.input_layernorm(x)
                q = attn.q_proj(h).view(1, N, self.n_heads, self.head_dim)
                k = attn.k_proj(h).view(1, N, self.n_kv, self.head_dim)
                v = attn.v_proj(h).view(1, N, self.n_kv, self.head_dim)
                if hasattr(attn, "q_norm"):
                    q, k = attn.q_norm(q), attn.k_norm(k)
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)       # (1, heads, N, head_dim)
                Kc, Vc = self.k[li], self.v[li]
                for (s, _), a, n, ln in zip(batch, starts[:-1], ns, lens, strict=True):
                    Kc[s, :, ln:ln + n] = k[0, :, a:a + n]
                    Vc[s, :, ln:ln + n] = v[0, :, a:a + n]
                o = q.new_empty((N, self.n_heads * self.head_dim))
                for g in groups:
                    if g.contiguous is not None:
                        Ka = Kc[g.contiguous:g.contiguous + g.size, :, :g.T]
                        Va = Vc[g.contiguous:g.contiguous + g.size, :, :g.T]
                    else:
                        Ka, Va = Kc[g.slots, :, :g.T], Vc[g.slots, :, :g.T]
                    qg = q[0][:, g.gather].transpose(0, 1)            # (rows, heads, Q, head_dim)
                    og = torch.nn.functional.scaled_dot_product_attention(
                        qg, Ka, Va, attn_mask=g.mask, scale=attn.scaling, enable_gqa=self.n_kv != self.n_heads,
                    )
                    og = og.transpose(1, 2).reshape(-1, self.n_heads * self.head_dim)
                    o[g.scatter] = og[g.valid]
                x = x + attn.o_proj(o[None])
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        for (s, _), n in zip(batch, ns, strict=True):
            self.slots[s].length += n
        xf = x[0].float().cpu()
        return [xf[a:a + n] for a, n in zip(starts[:-1], ns, strict=True)]

    def _attention_group(self, rows: list[int], batch: list[tuple[int, list[int]]], ns: list[int],
                         lens: list[int], starts: list[int]) -> _Group:
        """Where a group's rows sit in the packed sequence, padded to its longest row, and their mask:

            query q of row b (absolute position len_b + q) may attend key j  iff  j <= len_b + q
            padded queries (q >= n_b) attend only key 0; their outputs are dropped"""
        import torch

        dev = self.device
        Q = max(ns[i] for i in rows)
        T = max(lens[i] + ns[i] for i in rows)
        qi = torch.arange(Q, device=dev)[None, :]                               # (1, Q)
        n = torch.tensor([ns[i] for i in rows], device=dev)[:, None]            # (B, 1)
        a = torch.tensor([starts[i] for i in rows], device=dev)[:, None]
        ln = torch.tensor([lens[i] for i in rows], device=dev)[:, None, None]
        pad = qi >= n                                                           # (B, Q)
        gather = torch.where(pad, a, a + qi)          # a padded query reads its row's first token
        kidx = torch.arange(T, device=dev)[None, None, :]
        mask = torch.where(pad[:, :, None], kidx == 0, kidx <= ln + qi[:, :, None])[:, None]   # (B, 1, Q, T)
        slots = [batch[i][0] for i in rows]
        contiguous = slots[0] if slots == list(range(slots[0], slots[0] + len(slots))) else None
        valid = ~pad.reshape(-1)
        return _Group(size=len(rows), T=T, gather=gather, mask=mask, valid=valid, scatter=gather.reshape(-1)[valid],
                      slots=torch.tensor(slots, device=dev), contiguous=contiguous)


@dataclass
class _Group:
    """One attention group of a packed step (see :meth:`SlotRunner._attention_group`)."""

    size: int
    T: int
    gather: Any
    mask: Any
    valid: Any
    scatter: Any
    slots: Any
    contiguous: int | None


def _length_groups(ns: Sequence[int], waste: float = 2.0) -> list[list[int]]:
    """Indices of ``ns`` grouped so that, in each group, the longest row is at most ``waste`` times the
    shortest (padded queries stay below half of a group's attention)."""
    order = sorted(range(len(ns)), key=lambda i: ns[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and ns[i] <= waste * ns[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class HFRunner:
    """Exact fallback for any HF decoder: per-stream HF cache, a hook on layer L, one stream at a time."""

    def __init__(self, model: Any, layer: int, max_slots: int = 16, max_len: int = 4096) -> None:
        layers = decoder_layers(model)
        if not 0 <= layer < len(layers):
            raise ValueError(f"layer {layer} outside 0..{len(layers) - 1}")
        import torch

        # Truncate to layers 0..L so the cost matches the monitor's (the output after L is all we read).
        inner = getattr(model, "model", model)
        inner.layers = torch.nn.ModuleList(list(layers)[: layer + 1])
        model.config.num_hidden_layers = layer + 1
        layers = inner.layers
        self.model, self.layer = model, layer
        self.max_slots, self.max_len = max_slots, max_len
        self._caps: dict[int, Any] = {}
        self._lens: dict[int, int] = {}
        self._out: Any = None

        def hook(_m: Any, _i: Any, out: Any) -> None:
            self._out = out[0] if isinstance(out, tuple) else out

        layers[layer].register_forward_hook(hook)

    def alloc(self) -> int:
        for i in range(self.max_slots):
            if i not in self._lens:
                self._lens[i] = 0
                self._caps[i] = None
                return i
        raise RuntimeError(f"all {self.max_slots} guard slots are busy")

    def free(self, slot: int) -> None:
        self._lens.pop(slot, None)
        self._caps.pop(slot, None)

    def length(self, slot: int) -> int:
        return self._lens[slot]

    def truncate(self, slot: int, n: int) -> None:
        """Forget the slot's last ``n`` tokens (the HF cache is cropped)."""
        ln = self._lens[slot]
        if not 0 <= n <= ln:
            raise ValueError(f"cannot drop {n} of slot {slot}'s {ln} tokens")
        if n:
            self._caps[slot].crop(ln - n)
            self._lens[slot] = ln - n

    @property
    def n_active(self) -> int:
        return len(self._lens)

    def step(self, batch: Sequence[tuple[int, Sequence[int]]]) -> list[Any]:
        import torch

        outs = []
        with torch.inference_mode():
            for s, ids in batch:
                if not len(ids):
                    continue
                t = torch.tensor([list(ids)], dtype=torch.long)
                r = self.model(input_ids=t, past_key_values=self._caps[s], use_cache=True)
                self._caps[s] = r.past_key_values
                self._lens[s] += len(ids)
                outs.append(self._out[0].float().cpu())
        return outs


def make_runner(model: Any, layer: int, max_slots: int = 16, max_len: int = 4096) -> SlotRunner | HFRunner:
    if str(getattr(model.config, "model_type", "")) in _LLAMA_FAMILY:
        return SlotRunner(model, layer, max_slots=max_slots, max_len=max_len)
    return HFRunner(model, layer, max_slots=max_slots, max_len=max_len)


def collect_residuals(
    runner: SlotRunner | HFRunner, token_lists: Sequence[Sequence[int]], batch_size: int = 16,
) -> list[Any]:
    """Offline: residual after layer L for whole sequences (batched prefill through the same runner)."""
    out: list[Any] = [None] * len(token_lists)
    order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        slots = [runner.alloc() for _ in idx]
        try:
            res = runner.step([(s, token_lists[j]) for s, j in zip(slots, idx, strict=True)])
            for j, r in zip(idx, res, strict=True):
                out[j] = r
        finally:
            for s in slots:
                runner.free(s)
    return out
