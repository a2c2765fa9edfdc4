"""Hand-written held-out prompt sets, read for evaluation only.

No build step (data, safeguard, SAE, read-outs, calibration) imports this module or reads these files;
``tests/guard/test_fresh_sets.py`` checks that none of their requests appears in the build's dataset or in
the recipe's prompt generators. See ``README.md`` beside this file for how they were written.

File format: one request per line, either ``category<TAB>request`` (the fresh sets) or a bare request (the
everyday and sensitive sets); blank lines and lines starting with ``#`` are skipped. A multi-line set
(:data:`BLOCK_SETS`: pasted logs, tables, code) holds one request per block: blocks are separated by a line
``---`` and each opens with ``## <category>``; the ``#`` lines before the first block are comments.
"""

from __future__ import annotations

from pathlib import Path

EVAL_DATA = Path(__file__).resolve().parent

# Each set and the label its requests carry: 1 = a harmful request the prompt gate should refuse, 0 = a
# request it should answer.
SETS: dict[str, int] = {
    "fresh_harmful": 1,
    "fresh_harmful_b": 1,
    "fresh_benign_edgy": 0,
    "fresh_harmful_c": 1,
    "fresh_benign_edgy_b": 0,
    "fresh_harmful_d": 1,
    "fresh_benign_edgy_c": 0,
    "fresh_harmful_e": 1,
    "fresh_benign_edgy_d": 0,
    "fresh_harmful_f": 1,
    "fresh_benign_edgy_e": 0,
    "fresh_harmful_g": 1,
    "fresh_benign_edgy_f": 0,
    "fresh_harmful_h": 1,
    "fresh_benign_edgy_g": 0,
    "fresh_harmful_i": 1,
    "fresh_benign_edgy_h": 0,
    "fresh_harmful_j": 1,
    "fresh_benign_edgy_i": 0,
    "fresh_harmful_k": 1,
    "fresh_benign_edgy_j": 0,
    "everyday": 0,
    "sensitive": 0,
    "structured": 0,
    "structured_b": 0,
}
# sets whose requests span several lines (see the module docstring)
BLOCK_SETS = frozenset({"structured", "structured_b"})


def eval_set_path(name_or_path: str | Path) -> Path:
    """A set's file: a bare name from :data:`SETS` resolves to ``<name>.txt`` beside this module, anything
    else is taken as a path."""
    p = Path(name_or_path)
    if p.suffix == "" and p.parent == Path("."):
        if p.name not in SETS:
            raise ValueError(f"unknown eval set {p.name!r}; known sets: {', '.join(SETS)} (or pass a file path)")
        return EVAL_DATA / f"{p.name}.txt"
    return p


def load_eval_prompts(path: str | Path) -> list[tuple[str, str]]:
    """``(category, request)`` for every request of a set, in file order.

    ``path`` is a set name (``"fresh_harmful"``, ``"fresh_benign_edgy"``, ``"everyday"``, ``"sensitive"``) or
    a file path. A bare request line (no tab) gets the category ``""``. A line with more than one tab, or a
    tab and no request, is an error naming the file and line, so a malformed edit cannot silently change a
    set.
    """
    f = eval_set_path(path)
    if f.stem in BLOCK_SETS:
        return _load_blocks(f)
    out: list[tuple[str, str]] = []
    for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.count("\t") > 1:
            raise ValueError(f"{f}:{n}: expected 'category<TAB>request', found {line.count(chr(9))} tabs")
        cat, _, text = line.partition("\t") if "\t" in line else ("", "", line)
        if not text.strip() or ("\t" in line and not cat.strip()):
            raise ValueError(f"{f}:{n}: expected 'category<TAB>request' with both parts non-empty")
        out.append((cat.strip(), text.strip()))
    return out


def _load_blocks(f: Path) -> list[tuple[str, str]]:
    lines = f.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    if any(line.strip() and not line.startswith("#") for line in lines[:start]):
        raise ValueError(f"{f}: text before the first '## <category>' block")
    out: list[tuple[str, str]] = []
    block: list[str] = []
    first = start + 1

    def close(at: int) -> None:
        if not block or not block[0].startswith("## ") or not block[0][3:].strip():
            raise ValueError(f"{f}:{at}: a block must open with '## <category>'")
        text = "\n".join(block[1:]).strip()
        if not text:
            raise ValueError(f"{f}:{at}: block '{block[0][3:].strip()}' has no request")
        out.append((block[0][3:].strip(), text))

    for n, line in enumerate(lines[start:], start + 1):
        if line == "---":
            close(first)
            block, first = [], n + 1
        else:
            block.append(line)
    if block:
        close(first)
    return out
