"""A raw ``/v1/completions`` prompt that spells out a chat conversation in the served model's markup is
read by the model as that conversation, so the guard reads it as one too: each turn under its role, and a
prompt that stops inside an assistant turn as an answer in progress (which the response gate carries into
its window). Plain text stays one user turn.

Two markups are recognised: ChatML (``<|im_start|>role\\n…<|im_end|>``: SmolLM2, Qwen and many others) and
Llama 3 headers (``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>``). A prompt in another template's
markup is scored as one user turn, markup and all.
"""

from __future__ import annotations

import re

from guard.text import ROLE_LABELS, Conversation

_CHATML = re.compile(r"<\|im_start\|>([a-z_]+)\n(.*?)(<\|im_end\|>|(?=<\|im_start\|>)|\Z)", re.DOTALL)
_LLAMA3 = re.compile(r"<\|start_header_id\|>([a-z_]+)<\|end_header_id\|>\n*(.*?)(<\|eot_id\|>|(?=<\|start_header_id\|>)|\Z)",
                     re.DOTALL)


def template_conversation(prompt: str) -> Conversation | None:
    """The conversation a marked-up prompt spells out, or None for plain text. Text outside the turns (a
    BOS marker, a stray preamble) is read as a user turn so nothing the model reads goes unscored. A last
    turn without its end marker is open: for an assistant, the answer in progress."""
    for pat, start in ((_CHATML, "<|im_start|>"), (_LLAMA3, "<|start_header_id|>")):
        if start not in prompt:
            continue
        turns: list[tuple[str, str]] = []
        pos = 0
        for m in pat.finditer(prompt):
            outside = prompt[pos:m.start()].replace("<|begin_of_text|>", "").strip()
            if outside:
                turns.append(("user", outside))
            role = m.group(1) if m.group(1) in ROLE_LABELS else "user"
            content = m.group(2)
            if m.group(3):          # a closed turn: its trailing newline belongs to the markup
                content = content.rstrip("\n")
            turns.append((role, content))
            pos = m.end()
        rest = prompt[pos:].strip()
        if rest:
            turns.append(("user", rest))
        # an empty assistant header at the end is the generation prompt, not an answer in progress
        if turns and turns[-1][0] == "assistant" and not turns[-1][1].strip():
            turns.pop()
        return tuple(turns) if turns else None
    return None
