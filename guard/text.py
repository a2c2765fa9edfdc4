"""The one text format the guard reads, for build, eval, ``/v1/guard/score``, moderation and the stream.

A conversation is a sequence of ``(role, content)`` turns. The guard reads it as plain text, one turn
per line, with the reference code's role labels (a single user turn is exactly ``"User: {text}"``)::

    System: {system message}
    User: {first user turn}
    Assistant: {earlier answer}
    User: {last user turn}
    Assistant: {response}

* The prompt gate scores every turn of the conversation (system, developer and tool messages and earlier
  turns included): everything the model reads can carry an attack.
* The response gate reads the conversation as context and scores only the response.
* Contents are stripped at both ends; the response loses its leading whitespace. The stream feeds the
  response through :class:`ResponseFeed`, which applies the same rule to the first deltas, so the text the
  stream scores is character for character the text a whole-sample score reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Turn = tuple[str, str]
Conversation = tuple[Turn, ...]

ROLE_LABELS = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
RESPONSE_LABEL = "\nAssistant:"


def role_label(role: str) -> str:
    try:
        return ROLE_LABELS[role]
    except KeyError:
        raise ValueError(f"Unknown role '{role}'. Available: {', '.join(ROLE_LABELS)}") from None


def conversation(turns: Iterable[Turn | Sequence[str]]) -> Conversation:
    """Normalise ``(role, content)`` pairs (roles checked, contents kept as given)."""
    out = []
    for t in turns:
        role, content = t[0], t[1]
        role_label(role)
        out.append((role, content))
    return tuple(out)


def user(text: str) -> Conversation:
    return (("user", text),)


@dataclass(frozen=True, slots=True)
class GuardText:
    text: str
    char_start: int      # first character of the scored span
    char_end: int        # one past the last character
    # a response's text: the characters of the conversation it answers that a response gate's context term
    # reads (:func:`context_chars`: after the leading system messages, before the response label)
    context: tuple[int, int] | None = None


def _line(role: str, content: str) -> str:
    return f"{role_label(role)}: {content.strip()}"


def conversation_text(conv: Conversation) -> str:
    if not conv:
        raise ValueError("a conversation needs at least one turn")
    return "\n".join(_line(r, c) for r, c in conv)


def prompt_text(conv: Conversation) -> GuardText:
    """The prompt gate's input: the whole conversation is scored (after the first role label)."""
    text = conversation_text(conv)
    start = len(role_label(conv[0][0])) + 2
    return GuardText(text, min(start, len(text)), len(text))


MAX_PROMPT_VIEWS = 8


def prompt_views(conv: Conversation, max_views: int = MAX_PROMPT_VIEWS) -> list[Conversation]:
    """The further texts the prompt gate scores beside the whole conversation; it refuses if any crosses.

    The gate reads a request as one mean over its tokens, so words around an unsafe request thin it out: a
    long system message, a benign instruction in front of a tool result or a prefilled answer that carries the
    request, a request split over turns. So each user message and tool result is scored alone as a user turn
    (a client writes the whole history, earlier turns included), as is an assistant turn last (a prefill);
    and, where there are several, the user messages and tool results joined as one. Earlier assistant turns
    are not: the response gate reads what the model makes of them. At most ``max_views`` messages are scored
    alone, the latest first, since each costs a guard forward; older ones are still in the joined view.
    Views equal to the conversation, or to one another, are dropped, so a single user message costs nothing
    more."""
    said = [t for r, t in conv if r in ("user", "tool") and t.strip()]
    prefill = split_carry(conv)[1]
    alone = said + [prefill] if prefill else said
    views = [user(t) for t in alone[max(0, len(alone) - max_views):]]
    if len(said) > 1:
        views.append(user("\n".join(said)))
    out: list[Conversation] = []
    for v in views:
        if v != conv and v not in out:
            out.append(v)
    return out


def split_carry(conv: Conversation) -> tuple[Conversation, str]:
    """A conversation that ends inside an assistant answer (an assistant turn last, after at least one other):
    the turns before it, and that answer, which the response gate reads as the start of the response."""
    if len(conv) >= 2 and conv[-1][0] == "assistant" and conv[-1][1].strip():
        return conv[:-1], conv[-1][1]
    return conv, ""


def response_context(conv: Conversation) -> str:
    """What precedes the response: the conversation and the assistant label (without its trailing space)."""
    return conversation_text(conv) + RESPONSE_LABEL


SYSTEM_ROLES = frozenset({"system", "developer"})


def context_chars(conv: Conversation) -> tuple[int, int]:
    """The characters of :func:`response_context` (and of :func:`response_text`) that a response gate's context
    term reads: from the content of the first turn after the leading system messages to the conversation's end.

    The term measures the risk of the request being answered. A system message is the deployment's standing
    instruction, the same on every request, so reading it would shift every answer's score by the operator's
    wording rather than by what was asked (a benign persona paragraph lifted benign stories over the threshold).
    The prompt gate still reads the system message, where an attack can hide. A conversation of system messages
    alone is read whole."""
    text = conversation_text(conv)
    pos = 0
    for role, content in conv:
        if role not in SYSTEM_ROLES:
            return pos + len(role_label(role)) + 2, len(text)
        pos += len(_line(role, content)) + 1
    return prompt_text(conv).char_start, len(text)


def response_text(conv: Conversation, response: str) -> GuardText:
    """The response gate's input: conversation as context, the response as the scored span."""
    head = response_context(conv)
    body = response.lstrip()
    text = head + " " + body
    return GuardText(text, len(head) + 1, len(text), context_chars(conv))


class ResponseFeed:
    """Turns streamed response deltas into the characters that follow :func:`response_context`, so that
    ``response_context(conv) + "".join(feed(d) for d in deltas) == response_text(conv, "".join(deltas)).text``.
    Leading whitespace of the response is dropped; the label's space comes with the first character."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, delta: str) -> str:
        if self.started:
            return delta
        delta = delta.lstrip()
        if not delta:
            return ""
        self.started = True
        return " " + delta


def token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int]:
    """Token index range [start, end) of the tokens that overlap [char_start, char_end).

    A token counts as valid if any of its non-space characters fall inside the span; a token made of
    the separator's trailing space plus the first word ("Ġword") therefore belongs to the span.
    Zero-width tokens (BOS, special tokens) never count.
    """
    start = end = None
    for i, (a, b) in enumerate(offsets):
        if b <= a:
            continue
        if b > char_start and a < char_end:
            if start is None:
                start = i
            end = i + 1
    if start is None or end is None:
        return (len(offsets), len(offsets))
    return (start, end)
