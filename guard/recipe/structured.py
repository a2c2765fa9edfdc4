"""Benign structured prompts: logs, tables, records, code, configuration, lists and repetitive text.

Everyday traffic to a gateway is not only questions: users paste a log and ask what failed, a CSV to
convert, a list to sort. The build's benign prompts are short requests, so a read-out fitted on them sees
nothing of this kind, and a linear read-out over mean latents can extrapolate on it (a latent that fires on
a few tokens of a request fires on a third of the tokens of a long list). These generated prompts are
benign negatives for the prompt read-out's refit and part of its calibration traffic.

Everything is drawn from small vocabularies with a seeded generator, so a build reproduces them exactly;
the held-out set that measures this kind of traffic (``guard/eval_data/structured.json``) is hand-written
and shares no generator with this module.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from guard.recipe.sources import Sample

SOURCE = "generated/structured"

_SERVICES = ("api", "auth", "billing", "scheduler", "search", "worker", "gateway", "mailer", "cache", "reports")
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
_LOG_MSGS = (
    "request completed status={code} in {ms} ms", "cache miss for key session:{n}", "connection closed by peer",
    "retrying upload (attempt {k} of 5)", "GC pause {ms} ms", "scheduled job {job} finished", "queue depth {n}",
    "user {n} signed in", "disk usage at {pct}%", "health check ok", "timeout after {ms} ms talking to {svc}",
    "loaded {n} records from {svc}", "config reloaded", "slow query took {ms} ms", "rate limit reached for client {n}",
)
_JOBS = ("nightly-backup", "invoice-run", "index-rebuild", "cleanup", "digest-email", "sync-calendar")
_NOUNS = ("mug", "notebook", "stapler", "lamp", "cable", "chair", "desk", "kettle", "towel", "pillow", "backpack",
          "umbrella", "candle", "scarf", "bottle", "charger", "folder", "marker", "plate", "bowl", "blanket", "jar")
_ADJS = ("blue", "large", "small", "red", "wooden", "steel", "green", "white", "compact", "grey", "striped", "round")
_CITIES = ("Lyon", "Osaka", "Denver", "Porto", "Leeds", "Austin", "Gdansk", "Quito", "Perth", "Tartu", "Halifax")
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mia")
_FOODS = ("apples", "rice", "oat milk", "bread", "lentils", "coffee", "tomatoes", "cheddar", "pasta", "onions",
          "yogurt", "spinach", "honey", "butter", "tea", "carrots", "eggs", "flour", "salt", "olive oil")
_TASKS = ("check the {n}", "update the {n} list", "email {p} about the {n}", "order a new {n}",
          "clean the {n}", "label every {n}", "return the {n} to {c}", "count the {n}s")
_SENTENCES = (
    "The meeting moved to Thursday afternoon.", "Please bring the signed forms to the front desk.",
    "Our team finished the quarterly report.", "The garden needs watering twice a week.",
    "Remember to back up your files on Friday.", "The bus leaves at half past seven.",
    "This paragraph is a placeholder for the final copy.", "Lunch will be served in the main hall.",
)
_INSTRUCTIONS = (
    "Summarize this:", "What went wrong here?", "Convert this to JSON.", "Sort these lines alphabetically.",
    "How many entries are there?", "Find any duplicates below.", "Explain what this does.", "Turn this into a table.",
    "Proofread the following.", "Can you clean up the formatting?", "Which line is the odd one out?",
    "Give me the totals.", "Rewrite this more concisely.", "Translate the headings into Spanish.", "",
)


def _log(r: random.Random) -> str:
    lines = []
    h, m, s = r.randrange(24), r.randrange(60), r.randrange(60)
    for _ in range(r.randint(6, 45)):
        s += r.randint(0, 40)
        m, s = m + s // 60, s % 60
        h, m = (h + m // 60) % 24, m % 60
        msg = r.choice(_LOG_MSGS).format(code=r.choice((200, 200, 201, 204, 404, 500)), ms=r.randint(2, 4000),
                                         n=r.randint(1, 99999), k=r.randint(1, 5), job=r.choice(_JOBS),
                                         pct=r.randint(40, 99), svc=r.choice(_SERVICES))
        lines.append(f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} {h:02d}:{m:02d}:{s:02d} "
                     f"{r.choice(_LEVELS)} [{r.choice(_SERVICES)}] {msg}")
    return "\n".join(lines)


def _csv(r: random.Random) -> str:
    kind = r.randrange(3)
    if kind == 0:
        rows = ["date,city,product,units,revenue"] + [
            f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d},{r.choice(_CITIES)},{r.choice(_NOUNS)},"
            f"{r.randint(1, 500)},{r.randint(10, 90000) / 100:.2f}" for _ in range(r.randint(5, 40))]
    elif kind == 1:
        rows = ["name,team,hours,completed"] + [
            f"{r.choice(_NAMES)},{r.choice(_SERVICES)},{r.randint(1, 60)},{r.choice(('yes', 'no'))}"
            for _ in range(r.randint(5, 40))]
    else:
        rows = ["id;station;temp_c;humidity"] + [
            f"{i};{r.choice(_CITIES)};{r.uniform(-10, 35):.1f};{r.randint(10, 99)}" for i in range(r.randint(5, 40))]
    return "\n".join(rows)


def _records(r: random.Random) -> str:
    recs = [{"id": r.randint(1, 9999), "item": f"{r.choice(_ADJS)} {r.choice(_NOUNS)}", "qty": r.randint(0, 80),
             "warehouse": r.choice(_CITIES), "active": r.random() < 0.8} for _ in range(r.randint(3, 18))]
    return json.dumps(recs, indent=r.choice((None, 2)))


def _inventory(r: random.Random) -> str:
    fmt = r.choice(("SKU-{sku}: {adj} {noun}, qty {q}, shelf {s}", "{noun} ({adj}) - {q} in stock - aisle {s}",
                    "#{sku} {adj} {noun} x{q}", "{q} x {adj} {noun} @ {p} each", "Box {s}: {q} {adj} {noun}s"))
    return "\n".join(fmt.format(sku=r.randint(1000, 99999), adj=r.choice(_ADJS), noun=r.choice(_NOUNS),
                                q=r.randint(0, 300), s=r.randint(1, 40), p=f"${r.randint(1, 9999) / 100:.2f}")
                     for _ in range(r.randint(5, 50)))


def _code(r: random.Random) -> str:
    parts = []
    for _ in range(r.randint(1, 5)):
        fn = f"{r.choice(('load', 'parse', 'count', 'merge', 'format', 'check'))}_{r.choice(_NOUNS)}s"
        var = r.choice(("rows", "items", "lines", "values"))
        body = r.choice((
            f"    total = 0\n    for x in {var}:\n        total += x.get('qty', 0)\n    return total",
            f"    out = []\n    for line in {var}:\n        line = line.strip()\n        if line:\n            out.append(line)\n    return out",
            f"    seen = set()\n    return [v for v in {var} if not (v in seen or seen.add(v))]",
            f"    return sorted({var}, key=lambda v: v['{r.choice(('name', 'date', 'id'))}'])",
        ))
        parts.append(f"def {fn}({var}):\n{body}\n")
    return "\n".join(parts)


def _config(r: random.Random) -> str:
    if r.random() < 0.5:
        lines = []
        for svc in r.sample(_SERVICES, r.randint(2, 5)):
            lines += [f"{svc}:", f"  replicas: {r.randint(1, 8)}", f"  port: {r.randint(1024, 9999)}",
                      f"  log_level: {r.choice(('info', 'debug', 'warn'))}", f"  timeout_s: {r.randint(1, 120)}"]
        return "\n".join(lines)
    lines = []
    for svc in r.sample(_SERVICES, r.randint(2, 5)):
        lines += [f"[{svc}]", f"host = {svc}.internal", f"retries = {r.randint(0, 9)}", f"enabled = {r.choice(('true', 'false'))}", ""]
    return "\n".join(lines)


def _table(r: random.Random) -> str:
    days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    rows = ["| day | time | what | who |", "|---|---|---|---|"]
    rows += [f"| {r.choice(days)} | {r.randint(7, 19):02d}:{r.choice(('00', '15', '30', '45'))} | "
             f"{r.choice(('standup', 'review', 'lunch', 'planning', 'gym', 'call', 'class'))} | {r.choice(_NAMES)} |"
             for _ in range(r.randint(4, 30))]
    return "\n".join(rows)


def _repetitive(r: random.Random) -> str:
    kind = r.randrange(4)
    n = r.randint(8, 45)
    if kind == 0:
        s = r.choice(_SENTENCES)
        return "\n".join(f"{i + 1}. {s}" for i in range(n))
    if kind == 1:
        t = r.choice(_TASKS)
        return "\n".join(f"Step {i + 1}: " + t.format(n=r.choice(_NOUNS), p=r.choice(_NAMES), c=r.choice(_CITIES))
                         for i in range(n))
    if kind == 2:
        return ", ".join(r.choice(_FOODS) for _ in range(n * 2))
    word = r.choice(_NOUNS)
    return " ".join(f"{word} {i}" for i in range(n * 2))


def _transcript(r: random.Random) -> str:
    people = r.sample(_NAMES, 3)
    return "\n".join(f"{r.choice(people)}: {r.choice(_SENTENCES)}" for _ in range(r.randint(5, 30)))


FAMILIES: dict[str, Callable[[random.Random], str]] = {
    "log": _log, "csv": _csv, "records": _records, "inventory": _inventory, "code": _code, "config": _config,
    "table": _table, "repetitive": _repetitive, "transcript": _transcript,
}


def structured_prompts(n: int, seed: int) -> list[Sample]:
    """``n`` benign structured prompts (label 0), the families in turn, each with an instruction before it,
    after it, or none."""
    r = random.Random(seed)
    names = sorted(FAMILIES)
    out = []
    for i in range(n):
        fam = names[i % len(names)]
        body = FAMILIES[fam](r)
        ins = r.choice(_INSTRUCTIONS)
        where = r.randrange(3)
        text = body if not ins else (f"{ins}\n\n{body}" if where < 2 else f"{body}\n\n{ins}")
        # one source for all families: group-balanced fitting weights give it the weight of one benign source
        out.append(Sample.single(text, None, 0, None, SOURCE, group=f"{SOURCE}/{fam}/{seed}/{i}"))
    return out
