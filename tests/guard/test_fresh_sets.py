"""The freshly written evaluation sets: well formed, no duplicates, and no overlap with anything a build
reads (the published dataset's texts), so numbers on them cannot be inflated by training."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from guard.evaluate import EVAL_DATA, load_labelled_prompts

ART = Path(__file__).resolve().parents[2] / "guard" / "artifacts" / "data.jsonl.gz"


def _norm(t: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", t.lower()).strip()


@pytest.mark.parametrize("name,min_n,min_cats", [("fresh_harmful", 100, 8), ("fresh_benign_edgy", 90, 8)])
def test_format_and_counts(name: str, min_n: int, min_cats: int) -> None:
    rows = load_labelled_prompts(name)
    assert len(rows) >= min_n
    assert len({c for c, _ in rows}) >= min_cats and all(c for c, _ in rows)
    texts = [_norm(t) for _, t in rows]
    assert len(set(texts)) == len(texts), "duplicate requests"
    for line in (EVAL_DATA / f"{name}.txt").read_text().splitlines():
        assert line.startswith("#") or line.count("\t") == 1, line


def test_no_overlap_with_the_build_data_or_each_other() -> None:
    fresh = {_norm(t) for n in ("fresh_harmful", "fresh_benign_edgy") for _, t in load_labelled_prompts(n)}
    assert not ({_norm(t) for _, t in load_labelled_prompts("fresh_harmful")}
                & {_norm(t) for _, t in load_labelled_prompts("fresh_benign_edgy")})
    seen = set()
    with gzip.open(ART, "rt") as f:
        for line in f:
            d = json.loads(line)
            for _, content in d["conv"]:
                seen.add(_norm(content))
    assert not (fresh & seen)
    # no fresh request is contained in a longer build text either
    long_texts = [s for s in seen if len(s) > 40]
    for t in fresh:
        assert not any(t in s for s in long_texts), t
