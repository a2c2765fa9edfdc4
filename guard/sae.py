"""SAE loading, JumpReLU conversion and the serve-time selected-column encoder.

Offline (build, selection) we use sae-lens SAE classes as they are. At serve time the monitor needs
only the K selected latents, and after the JumpReLU conversion each latent is independent of the
others (no TopK competition), so encoding is ``(x - b_dec) @ W_enc[:, S] + b_enc[S]`` gated at the
per-latent threshold: a (d_model x K) matmul instead of (d_model x d_sae).

torch and sae_lens are imported lazily so that importing :mod:`guard` stays cheap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from sae_lens import SAE

# normalize_activations modes whose run-time input transform we reproduce per token. sae-lens folds
# "expected_average_only_in" into the weights when it saves an inference SAE, so it is the identity here.
_SUPPORTED_NORMS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")


def load_sae(path: str | Path, device: str = "cpu") -> SAE[Any]:
    """Load an SAE saved by sae-lens (``cfg.json`` + ``sae_weights.safetensors``)."""
    from sae_lens import SAE

    path = Path(path)
    if not (path / "cfg.json").exists():
        raise FileNotFoundError(
            f"No sae-lens SAE at {path} (missing cfg.json). Build one with `nextguard guard build`, "
            "or convert a dictionary_learning checkpoint with guard.sae.load_dictionary_learning_batchtopk()."
        )
    return SAE.load_from_disk(str(path), device=device).eval()


def save_sae(sae: SAE[Any], path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sae.save_model(str(path))
    return path


def jumprelu_from_weights(
    W_enc: torch.Tensor,
    b_enc: torch.Tensor,
    W_dec: torch.Tensor,
    b_dec: torch.Tensor,
    threshold: float | torch.Tensor,
    *,
    apply_b_dec_to_input: bool = True,
    normalize_activations: str = "none",
) -> SAE[Any]:
    """Build a sae-lens ``JumpReLUSAE`` from raw weights; a scalar threshold is broadcast to every latent.

    This is the reference code's conversion of a (Batch)TopK SAE: one learned scalar threshold for all
    latents, which makes each latent independent of the others at inference.
    ``W_enc`` is (d_in, d_sae), ``W_dec`` is (d_sae, d_in) (sae-lens orientation).
    """
    import torch
    from sae_lens import JumpReLUSAE, JumpReLUSAEConfig

    d_in, d_sae = W_enc.shape
    if W_dec.shape != (d_sae, d_in):
        raise ValueError(f"W_dec has shape {tuple(W_dec.shape)}, expected {(d_sae, d_in)} (d_sae, d_in)")
    cfg = JumpReLUSAEConfig(
        d_in=int(d_in), d_sae=int(d_sae), dtype="float32", device="cpu",
        apply_b_dec_to_input=apply_b_dec_to_input, normalize_activations=normalize_activations,  # type: ignore[arg-type]
    )
    sae = JumpReLUSAE(cfg)
    thr = threshold if isinstance(threshold, torch.Tensor) else torch.tensor(float(threshold))
    thr = thr.float().expand(int(d_sae)).clone() if thr.numel() == 1 else thr.float().reshape(int(d_sae))
    with torch.no_grad():
        sae.W_enc.copy_(W_enc.float())
        sae.b_enc.copy_(b_enc.float())
        sae.W_dec.copy_(W_dec.float())
        sae.b_dec.copy_(b_dec.float())
        sae.threshold.copy_(thr)
    return sae.eval()


def topk_to_jumprelu(sae: SAE[Any], threshold: float) -> SAE[Any]:
    """Convert a sae-lens TopK/BatchTopK SAE into a JumpReLU SAE with one scalar threshold."""
    return jumprelu_from_weights(
        sae.W_enc.detach(), sae.b_enc.detach(), sae.W_dec.detach(), sae.b_dec.detach(), threshold,
        apply_b_dec_to_input=bool(sae.cfg.apply_b_dec_to_input),
        normalize_activations=str(sae.cfg.normalize_activations),
    )


def estimate_topk_threshold(sae: SAE[Any], acts: torch.Tensor) -> float:
    """A TopK SAE has no learned threshold; BatchTopK training tracks the mean over batches of the
    smallest positive kept activation. We use the same statistic on a sample of activations."""
    import torch

    with torch.no_grad():
        f = sae.encode(acts.float())
        mins = []
        for row in f:
            pos = row[row > 0]
            if pos.numel():
                mins.append(float(pos.min()))
    if not mins:
        raise ValueError("The TopK SAE produced no positive activation on the sample; cannot set a threshold")
    return float(sum(mins) / len(mins))


def load_dictionary_learning_batchtopk(path: str | Path) -> SAE[Any]:
    """Load a ``dictionary_learning`` BatchTopK checkpoint (``ae.pt`` + ``config.json``), e.g.
    adamkarvonen/qwen3-8b-saes ``.../resid_post_layer_18/trainer_2``, as a JumpReLU SAE.

    dictionary_learning stores ``encoder.weight`` (d_sae, d_in), ``encoder.bias`` (d_sae),
    ``decoder.weight`` (d_in, d_sae), ``b_dec`` (d_in), ``threshold`` (scalar) and ``k``; its encoder
    subtracts ``b_dec`` from the input, as sae-lens does with ``apply_b_dec_to_input``.
    """
    import torch

    path = Path(path)
    ckpt = path / "ae.pt" if path.is_dir() else path
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)
    missing = [k for k in ("encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "threshold") if k not in sd]
    if missing:
        raise ValueError(f"{ckpt} is not a dictionary_learning BatchTopK checkpoint: missing {missing}; has {sorted(sd)}")
    thr = sd["threshold"]
    if thr.numel() != 1:
        raise ValueError(f"expected one scalar BatchTopK threshold, got shape {tuple(thr.shape)}")
    if float(thr) < 0:
        # dictionary_learning initialises the threshold to -1 and only sets it during training.
        raise ValueError(f"{ckpt}: threshold {float(thr)} < 0 means the checkpoint never learned one")
    return jumprelu_from_weights(
        sd["encoder.weight"].T, sd["encoder.bias"], sd["decoder.weight"].T, sd["b_dec"], thr,
    )


@dataclass
class SelectedEncoder:
    """Encoder restricted to a set of latent ids. Equal to ``sae.encode(x)[..., ids]`` for JumpReLU SAEs.

    It may also carry residual probes: linear read-outs of the raw residual (before any SAE normalisation),
    appended after the latents as columns with negative ids (:func:`probe_id`). They read what the
    dictionary does not reconstruct, at the cost of one dot product per token."""

    ids: list[int]
    W: Any            # torch.Tensor (d_in, K)
    b: Any            # torch.Tensor (K,)
    b_dec: Any        # torch.Tensor (d_in,) subtracted from the input when apply_b_dec is set
    threshold: Any    # torch.Tensor (K,)
    apply_b_dec: bool = True
    normalize: str = "none"
    probe_W: Any = None                                   # torch.Tensor (d_in, P) or None
    probe_ids: list[int] = field(default_factory=list)    # P negative ids, in probe_W's column order

    def __post_init__(self) -> None:
        n = 0 if self.probe_W is None else int(self.probe_W.shape[1])
        if n != len(self.probe_ids) or any(i >= 0 for i in self.probe_ids):
            raise ValueError(f"residual probes need one negative id per column: {n} columns, ids {self.probe_ids}")

    @property
    def columns(self) -> list[int]:
        """The ids of the activation matrix's columns, in order: the latents, then the residual probes."""
        return [*self.ids, *self.probe_ids]

    def with_probes(self, W: Any, ids: Sequence[int]) -> SelectedEncoder:
        """This encoder with ``W`` (d_in, P) as its residual probes (replacing any it had)."""
        import torch

        W = torch.as_tensor(W, dtype=torch.float32).reshape(self.d_in, -1).clone()
        return replace(self, probe_W=W, probe_ids=[int(i) for i in ids])

    @classmethod
    def from_sae(cls, sae: SAE[Any], ids: Sequence[int]) -> SelectedEncoder:
        arch = sae.cfg.architecture()
        if arch != "jumprelu":
            raise ValueError(
                f"SelectedEncoder needs latents that are independent of each other (JumpReLU); got '{arch}'. "
                "Convert with topk_to_jumprelu() first."
            )
        norm = str(sae.cfg.normalize_activations)
        if norm not in _SUPPORTED_NORMS:
            raise ValueError(f"normalize_activations='{norm}' is not supported; supported: {_SUPPORTED_NORMS}")
        idx = [int(i) for i in ids]
        return cls(
            ids=idx,
            W=sae.W_enc.detach()[:, idx].clone().float(),
            b=sae.b_enc.detach()[idx].clone().float(),
            b_dec=sae.b_dec.detach().clone().float(),
            threshold=sae.threshold.detach()[idx].clone().float(),
            apply_b_dec=bool(sae.cfg.apply_b_dec_to_input),
            normalize=norm,
        )

    @property
    def d_in(self) -> int:
        return int(self.W.shape[0])

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) -> (..., K). Every step is per token, so it is causal."""
        import torch

        x = x.float()
        raw = x
        if self.normalize == "constant_norm_rescale":
            x = x * (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
        elif self.normalize == "layer_norm":
            x = x - x.mean(dim=-1, keepdim=True)
            x = x / (x.std(dim=-1, keepdim=True) + 1e-5)
        if self.apply_b_dec:
            x = x - self.b_dec
        pre = x @ self.W + self.b
        acts = torch.relu(pre) * (pre > self.threshold).to(pre.dtype)
        if self.probe_W is None:
            return acts
        return torch.cat([acts, raw @ self.probe_W], dim=-1)

    def state_dict(self) -> dict[str, Any]:
        sd = {"W": self.W, "b": self.b, "b_dec": self.b_dec, "threshold": self.threshold}
        return sd if self.probe_W is None else {**sd, "probe_W": self.probe_W}

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(path / "selected_encoder.safetensors"))
        (path / "selected_encoder.json").write_text(
            json.dumps({"ids": self.ids, "apply_b_dec": self.apply_b_dec, "normalize": self.normalize,
                        "probe_ids": self.probe_ids})
        )

    @classmethod
    def load(cls, path: str | Path) -> SelectedEncoder:
        from safetensors.torch import load_file

        path = Path(path)
        meta = json.loads((path / "selected_encoder.json").read_text())
        t = load_file(str(path / "selected_encoder.safetensors"))
        return cls(ids=meta["ids"], W=t["W"], b=t["b"], b_dec=t["b_dec"], threshold=t["threshold"],
                   apply_b_dec=meta["apply_b_dec"], normalize=meta["normalize"], probe_W=t.get("probe_W"),
                   probe_ids=[int(i) for i in meta.get("probe_ids", [])])


def probe_id(j: int) -> int:
    """The column id of residual probe ``j`` (negative, so it never names an SAE latent)."""
    return -(j + 1)


def sae_metrics(sae: SAE[Any], acts: torch.Tensor, batch: int = 4096) -> dict[str, float]:
    """Variance explained (1 - FVU), mean L0 and the fraction of dead latents on ``acts``."""
    import torch

    sse = 0.0
    fired = None
    l0_sum = 0.0
    n = acts.shape[0]
    mean = acts.float().mean(0)
    sst = float(((acts.float() - mean) ** 2).sum())
    with torch.no_grad():
        for i in range(0, n, batch):
            x = acts[i:i + batch].float()
            f = sae.encode(x)
            r = sae.decode(f)
            sse += float(((x - r) ** 2).sum())
            l0_sum += float((f > 0).sum())
            any_f = (f > 0).any(0)
            fired = any_f if fired is None else (fired | any_f)
    assert fired is not None
    return {
        "variance_explained": 1.0 - sse / max(sst, 1e-12),
        "l0": l0_sum / max(n, 1),
        "dead_fraction": float((~fired).float().mean()),
        "n_tokens": float(n),
    }
