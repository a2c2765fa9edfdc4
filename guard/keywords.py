"""A plain keyword list: the baseline a safety gateway must beat.

This is what an operator without a learned monitor would deploy: per category, a handful of regular
expressions over words and phrases that name a harm (weapons and explosives, drugs, malware, violence,
self-harm, sexual content involving minors, fraud, hate, extremism, surveillance of a person). A text's
score is the share of categories that match, weighted so that one strong phrase is enough to flag it;
``keyword_flag`` is ``score > 0``. It reads words, not intent, so it flags "how do I kill a Python process"
and misses a harmful request worded around its list: the evaluation ladder puts it beside the monitor on
the same samples and the same budget. It is never used to serve.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Each pattern is matched case-insensitively on word boundaries. Kept short and literal on purpose: a
# baseline, not a second detector.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "weapons_explosives": (
        r"bomb", r"pipe ?bomb", r"explosives?", r"detonat\w*", r"grenade", r"napalm", r"molotov",
        r"thermite", r"ied", r"untraceable (gun|firearm)", r"ghost gun", r"silencer", r"suppressor",
        r"3d[- ]print(ed)? (gun|firearm)", r"full[- ]auto", r"nerve agent", r"sarin", r"ricin", r"anthrax",
        r"bioweapon", r"chemical weapon", r"dirty bomb",
    ),
    "drugs": (
        r"meth(amphetamine)?", r"cook meth", r"fentanyl", r"heroin", r"cocaine", r"crack cocaine", r"lsd",
        r"synthesi[sz]e (drugs?|mdma|meth|fentanyl)", r"mdma", r"drug lab", r"sell drugs", r"smuggl\w*",
    ),
    "malware_hacking": (
        r"malware", r"ransomware", r"keylogger", r"trojan", r"botnet", r"rootkit", r"spyware", r"ddos",
        r"exploit", r"zero[- ]day", r"hack(ing)? into", r"crack (a |the )?password", r"phishing",
        r"sql injection", r"steal (credentials|passwords)", r"bypass (authentication|2fa|security)",
    ),
    "violence": (
        r"kill (him|her|them|someone|people|my)", r"murder", r"assassinat\w*", r"torture", r"kidnap\w*",
        r"hurt (someone|people|him|her|them)", r"mass shooting", r"stab", r"poison (someone|him|her|my)",
        r"strangle", r"beat (him|her|them|someone) up", r"armed robbery", r"hostage",
    ),
    "self_harm": (
        r"kill myself", r"suicide", r"end my life", r"self[- ]harm", r"cut myself", r"overdose",
        r"lethal dose", r"hang myself",
    ),
    "sexual_minors": (
        r"child (porn\w*|sexual)", r"sexual\w* .{0,20}(minor|child|kid)s?", r"underage (sex|nude)", r"groom(ing)? (a )?(child|kid|minor)",
        # the abbreviation, not "cp": that is also the Unix copy command
        r"csam",
    ),
    "fraud": (
        r"counterfeit", r"launder(ing)? money", r"money laundering", r"fake (id|passport|invoice)s?",
        r"credit card (fraud|numbers)", r"identity theft", r"steal (someone'?s )?identity", r"scam",
        r"ponzi", r"insurance fraud", r"tax evasion", r"forge(d|ry)?",
    ),
    "hate_harassment": (
        r"racial slurs?", r"ethnic cleansing", r"inferior race", r"white power", r"gas the", r"harass\w*",
        r"dox(x)?(ing)?", r"bully\w*", r"hate speech",
    ),
    "extremism": (
        r"terroris\w*", r"jihad\w*", r"radicali[sz]\w*", r"recruit .{0,20}(extremist|terror)\w*", r"manifesto",
        r"attack on (a |the )?(station|school|church|mosque|synagogue|crowd)",
    ),
    "surveillance_privacy": (
        r"track (someone|my (ex|wife|husband|girlfriend|boyfriend))", r"stalk\w*", r"spy on",
        r"home address of", r"find (out )?where .{0,30} lives", r"hidden camera", r"gps tracker on",
    ),
}


@lru_cache(maxsize=1)
def _compiled() -> dict[str, re.Pattern[str]]:
    return {c: re.compile(r"\b(?:" + "|".join(ps) + r")\b", re.IGNORECASE) for c, ps in CATEGORIES.items()}


def keyword_hits(text: str) -> dict[str, list[str]]:
    """Per category, the phrases of the list found in ``text`` (categories without a hit are left out)."""
    out: dict[str, list[str]] = {}
    for cat, pat in _compiled().items():
        found = sorted({m.group(0).lower() for m in pat.finditer(text)})
        if found:
            out[cat] = found
    return out


def keyword_score(text: str) -> float:
    """In [0, 1]: 0 without a hit; one hit gives 0.5, and each further distinct phrase or category adds,
    so texts that name several harms rank above texts that brush one word."""
    hits = keyword_hits(text)
    if not hits:
        return 0.0
    n_phrases = sum(len(v) for v in hits.values())
    return min(1.0, 0.5 + 0.1 * (len(hits) - 1) + 0.05 * (n_phrases - 1))


def keyword_flag(text: str) -> bool:
    return keyword_score(text) > 0.0
