"""Production guard / SAE pairings, loadable by the same build and serving code.

Each pairing is a post-hoc safeguard whose parent model has public residual-stream SAEs:

=================  ==============================  =====  =================================================
name               guard model                     layer  SAE
=================  ==============================  =====  =================================================
qwen3guard-8b      Qwen/Qwen3Guard-Gen-8B          18     adamkarvonen/qwen3-8b-saes, BatchTopK trainer_2
                                                          (65k, k=80) -> JumpReLU with its one threshold
shieldgemma-2b     google/shieldgemma-2b           12     Gemma Scope gemma-scope-2b-pt-res-canonical
                                                          layer_12/width_16k/canonical (JumpReLU)
llama-guard-3-8b   meta-llama/Llama-Guard-3-8B     15     Llama Scope llama_scope_lxr_8x l15r_8x via sae-lens
=================  ==============================  =====  =================================================

``nextguard guard build --base-model <guard> --set sae_source=<name or kind:dir> --set safeguard.max_steps=0
--set sae.layers=[<L>]`` selects features and calibrates thresholds for the guard as given (no LoRA), and
the service loads the result like the embedded build. The SAEs are trained on the guard's parent
model and transferred, as in the paper. None of these weights can be fetched on the CPU dev box; the
loaders are tested on small local files of the same formats.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SAESource:
    kind: str                     # "dictionary_learning" | "sae_lens"
    repo_or_release: str
    path_or_id: str


@dataclass(frozen=True)
class ProductionConfig:
    name: str
    guard_model: str
    layer: int
    sae: SAESource
    note: str = ""


PRODUCTION: dict[str, ProductionConfig] = {}


def register(cfg: ProductionConfig) -> None:
    if cfg.name in PRODUCTION:
        raise ValueError(f"production config '{cfg.name}' already registered")
    PRODUCTION[cfg.name] = cfg


register(ProductionConfig(
    "qwen3guard-8b", "Qwen/Qwen3Guard-Gen-8B", 18,
    SAESource("dictionary_learning", "adamkarvonen/qwen3-8b-saes",
              "saes_Qwen_Qwen3-8B_batch_top_k/resid_post_layer_18/trainer_2"),
    "The paper's default pairing. Qwen3 prepends no BOS; hidden state = HF hidden_states[19]."))
register(ProductionConfig(
    "shieldgemma-2b", "google/shieldgemma-2b", 12,
    SAESource("sae_lens", "gemma-scope-2b-pt-res-canonical", "layer_12/width_16k/canonical"),
    "Gemma2 runs through HFRunner (soft-capping, sliding windows), one stream per forward."))
register(ProductionConfig(
    "llama-guard-3-8b", "meta-llama/Llama-Guard-3-8B", 15,
    SAESource("sae_lens", "llama_scope_lxr_8x", "l15r_8x"),
    "Llama Scope SAEs were trained on Llama-3.1-8B; the guard is its fine-tune."))


def get(name: str) -> ProductionConfig:
    if name not in PRODUCTION:
        close = difflib.get_close_matches(name, PRODUCTION, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"Unknown production config '{name}'.{hint} Available: {', '.join(sorted(PRODUCTION))}")
    return PRODUCTION[name]


def load_sae_source(spec: str) -> Any:
    """Load an SAE as a JumpReLU SAE from ``kind:location``.

    * ``dictionary_learning:<dir with ae.pt>`` (or ``dictionary_learning:<hub repo>/<path>`` when online)
    * ``sae_lens:<dir with cfg.json>`` (or ``sae_lens:<release>@<sae id>`` from the sae-lens registry)
    * ``<production name>`` (downloads, needs the hub)
    """
    from guard.sae import load_dictionary_learning_batchtopk, load_sae

    kind, _, loc = spec.partition(":")
    if not loc and kind in PRODUCTION:
        s = PRODUCTION[kind].sae
        kind, loc = s.kind, (f"{s.repo_or_release}/{s.path_or_id}" if s.kind == "dictionary_learning"
                             else f"{s.repo_or_release}@{s.path_or_id}")
    if kind == "dictionary_learning":
        p = Path(loc)
        if not p.exists():
            from huggingface_hub import hf_hub_download

            repo = "/".join(loc.split("/")[:2])
            sub = "/".join(loc.split("/")[2:])
            p = Path(hf_hub_download(repo, f"{sub}/ae.pt")).parent
        return load_dictionary_learning_batchtopk(p)
    if kind == "sae_lens":
        p = Path(loc)
        if p.exists():
            sae = load_sae(p)
        else:
            from sae_lens import SAE

            release, _, sae_id = loc.partition("@")
            sae = SAE.from_pretrained(release, sae_id, device="cpu")
        arch = sae.cfg.architecture()
        if arch != "jumprelu":
            raise ValueError(
                f"SAE architecture '{arch}' has dependent latents; convert it with guard.sae.topk_to_jumprelu() "
                "and guard.sae.estimate_topk_threshold() on activations first")
        return sae.eval()
    raise ValueError(f"Unknown SAE source kind '{kind}'. Available: dictionary_learning, sae_lens, "
                     f"or a production name: {', '.join(sorted(PRODUCTION))}")
