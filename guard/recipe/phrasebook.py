"""Requests rendered from phrase families: each family a few request frames with one ``{x}`` and the complete
phrases that fill them. The generated edgy negatives and direct harmful requests are both built this way."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence

from guard.recipe.sources import Sample

Families = Mapping[str, tuple[Sequence[str], Sequence[str]]]

# the share of requests rendered as many people type them, all lower case without the closing mark; benign and
# harmful requests draw it alike, so the register carries no label
LOWER_SHARE = 0.15


def phrase_part(phrase: str) -> str:
    """A phrase's split: about a third of every family's phrases are calibration-only, so no phrase a read-out
    is fitted on sets its threshold."""
    return "calib" if int(hashlib.sha256(phrase.encode()).hexdigest(), 16) % 3 == 0 else "select"


def render_requests(families: Families, leads: Sequence[str], n: int, seed: int, part: str, *, label: int,
                    source: str, category: Callable[[str], str | None] = lambda fam: None) -> list[Sample]:
    """``n`` requests from the phrases of ``part`` ("select" or "calib"), the families in turn; each a phrase of
    its family in one of its frames behind a lead-in, a share (:data:`LOWER_SHARE`) in lower case. Distinct
    renderings until a family's combinations run out, then repeats with another lead-in. One source for all
    families: group-balanced fitting weights give the whole generator the weight of one source."""
    if part not in ("select", "calib"):
        raise ValueError(f"part must be 'select' or 'calib', got {part!r}")
    r = random.Random(seed)
    names = sorted(families)
    combos = {f: [(fr, x) for fr in families[f][0] for x in families[f][1] if phrase_part(x) == part] for f in names}
    names = [f for f in names if combos[f]]
    for f in names:
        r.shuffle(combos[f])
    out = []
    for i in range(n):
        fam = names[i % len(names)]
        k = i // len(names)
        frame, x = combos[fam][k % len(combos[fam])]
        lead, body = r.choice(leads), frame.format(x=x)
        if lead.endswith((", ", ": ")) and not body.startswith(("I ", "I'")):
            body = body[0].lower() + body[1:]
        text = lead + body
        if r.random() < LOWER_SHARE:
            text = text.lower().rstrip("?.!")
        out.append(Sample.single(text, None, label, category(fam), source, group=f"{source}/{fam}/{part}/{seed}/{i}"))
    return out
