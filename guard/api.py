"""What the gateway asks of a streaming guard. Pure types and a protocol: no HTTP here.

The gateway's stream is a chain ``engine deltas -> guard.watch() -> SSE``. ``watch`` consumes the
engine's :class:`~inference.types.TokenDelta` stream of one choice and yields only the deltas it has
already scored (hold-back), and at most one :class:`SafetyCut` as its last item. A cut means the
caller must abort the engine request and finish the choice with ``finish_reason="content_filter"``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from guard.text import Conversation
from inference.types import TokenDelta


@dataclass(frozen=True, slots=True)
class FeatureActivation:
    id: int
    activation: float


@dataclass(frozen=True, slots=True)
class SafetyCut:
    """Why and where the guard stopped a prompt or a stream. Serialised as the ``safety`` extension."""

    category: str
    score: float
    threshold: float
    token_offset: int                    # index (0-based) of the first withheld generated token
    features: tuple[FeatureActivation, ...] = ()
    gate: str = "response"               # "prompt" | "response"
    char_offset: int | None = None
    decision: str = "intervened"         # "intervened" | "guard_error" (fail-closed) | "guard_busy" (no slot in time)
    # which of the gate's triggers crossed: its latent read-out ("readout", which ``features`` explain), the
    # response gate's residual probe alone ("residual_probe", which names no latent), or the prompt gate's sum
    # of the read-out and its residual probe ("combined", whose latent part ``features`` explain)
    trigger: str = "readout"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["features"] = [asdict(f) for f in self.features]
        return d


class GuardBusy(Exception):
    """No guard slot came free in time. The prompt gate raises it (the caller answers 503 with
    ``Retry-After``); the response gate ends the stream with a ``guard_busy`` :class:`SafetyCut` instead."""


class GuardInputError(ValueError):
    """The text cannot be scored as given: longer than the guard's context, or not valid Unicode. The
    caller's input, not a guard fault: it is refused (a 400 at the HTTP edge), never failed open or closed,
    since a fail-open policy would let unscored text through."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# Who waits for a guard slot. Slots are shared between clients round-robin (first come first served within
# one client), so a client flooding requests cannot starve another. The gateway puts the request's tenant
# here; unset, every request is the one client "" and the slots are plain first come first served.
GUARD_CLIENT: ContextVar[str] = ContextVar("nextguard_guard_client", default="")


@dataclass(frozen=True, slots=True)
class GuardFailure:
    """The guard could not score and the policy failed *open*: the text went on unscored. (A fail-closed
    failure needs no report: it is the ``guard_error`` :class:`SafetyCut` itself.)"""

    gate: str                            # "prompt" | "response"
    token_offset: int                    # generated tokens released (scored) before the failure
    error: str                           # the exception's type name (no message: it may quote content)


# A caller that counts fail-open failures puts a list here around its calls into ``check_prompt`` and
# each step of a ``watch`` stream; a guard calls :func:`report_fail_open` where it lets text through
# unscored. (An async generator's step runs in the context of the task that awaits it, so the report
# lands in the list of the request being served.) Nothing is recorded when no list is set.
FAIL_OPEN_SINK: ContextVar[list[GuardFailure] | None] = ContextVar("nextguard_guard_fail_open", default=None)


def report_fail_open(gate: str, token_offset: int, error: BaseException) -> None:
    sink = FAIL_OPEN_SINK.get()
    if sink is not None:
        sink.append(GuardFailure(gate=gate, token_offset=token_offset, error=type(error).__name__))


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    """Per-request / per-tenant policy. ``None`` fields fall back to the calibrated artifact values."""

    enabled: bool = True
    prompt_threshold: float | None = None
    response_threshold: float | None = None
    hold_back: int = 1                   # tokens withheld until scored (>= 1 means never send unscored)
    fail_closed: bool = True
    categories: tuple[str, ...] = field(default_factory=tuple)   # empty = all


@runtime_checkable
class StreamGuard(Protocol):
    """A monitor the gateway can put in the stream."""

    @property
    def ready(self) -> bool: ...

    @property
    def name(self) -> str: ...

    async def check_prompt(self, conversation: Conversation, policy: GuardPolicy) -> SafetyCut | None:
        """Prompt gate over every turn of the conversation: a cut means HTTP 400 ``content_filter``.
        Raises :class:`GuardBusy` when it could not get to score in time."""
        ...

    def watch(
        self, conversation: Conversation, deltas: AsyncIterator[TokenDelta], policy: GuardPolicy
    ) -> AsyncIterator[TokenDelta | SafetyCut]:
        """Response gate for one choice: yield scored deltas, then at most one cut (last item).
        Released deltas carry their tokens' scores in ``TokenDelta.scores``. A guard that cannot watch the
        stream in time yields a ``guard_busy`` cut first, so no unscored delta leaves."""
        ...

    def threshold(self, gate: str, policy: GuardPolicy) -> float:
        """The threshold in force for ``gate`` ("prompt" | "response") under ``policy``."""
        ...
