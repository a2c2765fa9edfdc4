"""Incremental re-tokenisation of a growing text with the guard's tokenizer (generator and guard tokenizers
may differ; and even with the same vocabulary, re-tokenising the text keeps the guard's tokens identical to
what a whole-sample score of the same text reads)."""

from __future__ import annotations

from typing import Any


class IncrementalRetokenizer:
    """Turns a growing text into guard tokens that are final.

    BPE / SentencePiece tokens never span a whitespace boundary *before* a word (the space is glued to
    the following word: "Ġword", "▁word"), so every token that ends at or before the last whitespace
    of the text can no longer change when more text arrives. Tokens after it are held until the next
    whitespace or the end of the stream. Unbroken runs longer than ``max_tail_chars`` (code, CJK) are
    committed except their last two tokens, which bounds the hold-back; that can, rarely, differ from
    tokenising the full text at once.
    """

    def __init__(self, tokenizer: Any, max_tail_chars: int = 64) -> None:
        self.tok = tokenizer
        self.max_tail = max_tail_chars
        self.text = ""            # everything received
        self.committed = 0        # characters covered by committed tokens

    def feed(self, new_text: str, final: bool = False) -> list[tuple[int, int, int]]:
        """Add text; return newly final tokens as (id, char_start, char_end) in the full text."""
        self.text += new_text
        tail = self.text[self.committed:]
        if not tail:
            return []
        enc = self.tok(tail, return_offsets_mapping=True, add_special_tokens=False)
        ids, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if final:
            n = len(ids)
        else:
            cut = max((i for i, ch in enumerate(tail) if ch.isspace()), default=-1)
            n = sum(1 for (_, b) in offs if b <= cut) if cut > 0 else 0
            # tokens are in order, so count the prefix that ends before the cut
            n = next((i for i, (_, b) in enumerate(offs) if b > cut), len(offs)) if cut > 0 else 0
            if n == 0 and len(tail) > self.max_tail:
                n = max(0, len(ids) - 2)
        out = []
        base = self.committed
        for i in range(n):
            a, b = offs[i]
            out.append((ids[i], base + a, base + b))
        if n:
            self.committed = base + offs[n - 1][1]
            # characters after the last committed token but before the next token (e.g. a trailing
            # space) stay in the tail, so the next token keeps its leading space
        return out

    def open_tail(self) -> list[tuple[int, int, int]]:
        """The tokens of the text not yet committed, as it would tokenise if the stream ended now; nothing
        is committed. They can change when more text arrives, so a caller scores them only provisionally."""
        tail = self.text[self.committed:]
        if not tail:
            return []
        enc = self.tok(tail, return_offsets_mapping=True, add_special_tokens=False)
        base = self.committed
        return [(int(t), base + a, base + b) for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]
