"""Turns and their contexts: what the caller said, and what to tell the model now.

A :class:`~slateflow.conversation.Conversation` records each user turn (a :class:`Turn`) and
builds a :class:`TurnContext` from its flows' briefs, the background results waiting in its
inbox and its tools (:func:`build_context`, a pure function), handed to the model in two phases
(built, then confirmed or dropped: its :class:`Handover`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..flow import Brief
from ..flow.brief import TellMarker
from ..resolve.background import BackgroundResult, Scheduling
from ..state import State

__all__ = [
    "DEFAULT_HOLD",
    "DEFAULT_MAX_TRANSCRIPT",
    "VOICE_TIMING_KEY",
    "Handover",
    "HandoverMode",
    "Turn",
    "TurnContext",
    "build_context",
    "check_hold",
    "check_options",
    "context_lines",
    "delivery_line",
    "end_turn",
    "publish_timing",
    "roll_back_turn",
]

log = logging.getLogger("slateflow.conversation")

UNMET_PREFIX = "Before finishing, these still need to happen: "
VOICE_TIMING_KEY = "session:voice_timing"
"""Where a conversation publishes the merged voice timing of its flows' speaking steps."""
TURN_SCOPES = ("turn:", "temp:")
"""The scopes a conversation clears at the end of every turn."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One line of the conversation: its ``number`` (the user turn it belongs to, from 1), the
    redacted ``text``, the clock time ``at``, and who spoke: ``speaker`` is ``"user"`` (a user
    turn) or ``"agent"`` (what the agent actually said, reported with ``agent_said``)."""

    number: int
    text: str
    at: float
    speaker: Literal["user", "agent"] = "user"


HandoverMode = Literal["auto", "explicit", "manual"]
"""What building a turn context does to the last one not confirmed: ``"auto"`` counts it as
handed to the model, ``"explicit"`` as dropped, ``"manual"`` leaves it pending (a voice loop
that knows which reply each context was spoken from confirms or drops each itself, even after
the next one was built)."""
DEFAULT_MAX_TRANSCRIPT = 10_000
"""Turns a conversation keeps in ``transcript`` (about 2 MB of typical turns)."""


_HINTS = {
    Scheduling.INTERRUPT: "tell the caller now",
    Scheduling.WHEN_IDLE: "tell the caller at a natural pause",
}


def in_words(value: Any, depth: int = 0) -> str:
    """A JSON value as a model reads it best: ``{"open": false, "alternative": "19:30"}``
    as "open: no; alternative: 19:30", a list of records numbered."""
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if depth > 2:
        return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    if isinstance(value, dict):
        parts = [f"{str(k).replace('_', ' ')}: {in_words(v, depth + 1)}" for k, v in value.items()]
        return ("; " if depth == 0 else ", ").join(parts) if parts else "nothing"
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        if all(isinstance(v, dict) for v in value):
            return " ".join(f"({i}) {in_words(v, depth + 1)}" for i, v in enumerate(value, 1))
        return ", ".join(in_words(v, depth + 1) for v in value)
    return str(value)


def delivery_line(result: BackgroundResult) -> str:
    """How a waiting background result is put to the model: in words, with what to do with
    it ("Result of availability (tell the caller at a natural pause): open: no; alternative:
    19:30."). A response a ``result_formatter`` shaped differently is put in words as it is."""
    name = result.name.replace("_", " ")
    hint = _HINTS.get(result.scheduling)
    head = f"Result of {name}" + (f" ({hint})" if hint else "")
    response = result.response
    if isinstance(response, dict) and "status" in response and "resolver" in response:
        status, note = response.get("status"), response.get("note")
        if status == "completed":
            text = in_words(response.get("result"))
        elif status == "error":
            text = f"it failed: {in_words(response.get('error'))}"
        else:
            text = f"it was {in_words(status)}"
        if note:
            text += f" ({in_words(note)})"
    else:
        text = in_words(response)
    return f"{head}: {text.rstrip('.')}."


class Handover:
    """Where a built :class:`TurnContext` stands between the conversation and the model.

    A context is ``"pending"`` when built: its deliveries have left the inbox, but nothing
    counts as said yet. ``confirm()`` (the loop handed it to the model) makes its deliveries
    delivered, its lines said and its steps' postures told; ``drop()`` (an interruption dropped
    it) puts its deliveries back in the inbox for the next context. Made by the conversation,
    which ``conclude`` tells which it was.
    """

    __slots__ = ("_conclude", "deliveries", "every", "final", "markers", "number", "seq", "status")

    def __init__(
        self,
        every: tuple[str, ...],
        deliveries: tuple[BackgroundResult, ...],
        markers: tuple[TellMarker, ...],
        conclude: Callable[[Handover, bool], None],
    ) -> None:
        self.every = every
        self.deliveries = deliveries
        self.markers = markers
        self.number = 0
        """The user turn it was built for (or after): what its told markers record."""
        self.seq = 0
        """Its place among the conversation's contexts (a later one's lines win)."""
        self.status: Literal["pending", "handed_over", "dropped"] = "pending"
        self.final = False
        """Counted as handed over when built (the call's closing words, in ``"auto"``): a
        later drop changes nothing, the call is over."""
        self._conclude = conclude

    def confirm(self) -> None:
        """The context reached the model."""
        self._conclude(self, True)

    def drop(self) -> None:
        """The context never reached the model."""
        self._conclude(self, False)


@dataclass(frozen=True)
class TurnContext:
    """What the model should be told after a user turn.

    ``postures``, ``grounds``, ``reprompts`` (a step's repair policy says the caller is stuck)
    and ``unmet`` come from the active steps of the conversation's flows;
    ``deliveries`` are the background results waiting for the model (each handed over exactly
    once, oldest first, with its ``scheduling``; ``silent`` ones get no line); ``tools`` are the
    tools it may call now and ``refused`` why each other known tool is refused.

    ``all_lines`` is every instruction line that applies now and ``full_prompt`` joins them: a
    loop that replaces its system prompt each turn uses it. ``lines`` leaves out what was
    already handed to the model before and ``prompt`` joins those: a loop that appends to one
    running conversation uses it (a model told the same posture twice starts to repeat itself).

    The hand-over has two phases. The context is built ``pending``; :meth:`handed_over` says
    the model got it (its deliveries count as delivered, its lines as said, its steps'
    postures as told) and :meth:`dropped` says it did not (an interruption dropped it: its
    deliveries come back in the next context). A simple loop calls neither: building the next
    context confirms this one (unless the conversation was made with ``handover="explicit"``).
    """

    turn: Turn
    postures: tuple[str, ...] = ()
    grounds: tuple[str, ...] = ()
    reprompts: tuple[str, ...] = ()
    unmet: tuple[str, ...] = ()
    deliveries: tuple[BackgroundResult, ...] = ()
    tools: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    voice_timing: dict[str, Any] | None = None
    all_lines: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    handover: Handover | None = field(default=None, compare=False, repr=False)

    @property
    def prompt(self) -> str:
        """The new instruction lines, one per line (empty when nothing changed)."""
        return "\n".join(self.lines)

    @property
    def full_prompt(self) -> str:
        """Every instruction line that applies now, one per line."""
        return "\n".join(self.all_lines)

    @property
    def status(self) -> Literal["pending", "handed_over", "dropped"]:
        """``"pending"`` until handed over or dropped (a context built with no hand-over is
        ``"handed_over"``)."""
        return "handed_over" if self.handover is None else self.handover.status

    def handed_over(self) -> None:
        """Say that the model got this context. Idempotent; raises
        :class:`~slateflow.errors.SessionError` if it was already dropped."""
        if self.handover is not None:
            self.handover.confirm()

    def dropped(self) -> None:
        """Say that the model never got this context: its deliveries go back to the inbox (first,
        in order) and its lines and postures do not count as said. Idempotent; raises
        :class:`~slateflow.errors.SessionError` if it was already handed over (except the
        goodbye of ``handover="auto"``, counted when built: dropping it changes nothing)."""
        if self.handover is not None:
            self.handover.drop()

    def __str__(self) -> str:
        return self.prompt

    def to_dict(self) -> dict[str, Any]:
        """The context as JSON-ready data, for a voice loop in another process or a log;
        each delivery is its name, scheduling and formatted response."""
        return {
            "turn": {
                "number": self.turn.number,
                "text": self.turn.text,
                "at": self.turn.at,
                "speaker": self.turn.speaker,
            },
            "postures": list(self.postures),
            "grounds": list(self.grounds),
            "reprompts": list(self.reprompts),
            "unmet": list(self.unmet),
            "deliveries": [
                {"name": d.name, "scheduling": d.scheduling.value, "response": d.response}
                for d in self.deliveries
            ],
            "tools": list(self.tools),
            "refused": dict(self.refused),
            "voice_timing": self.voice_timing,
            "lines": list(self.lines),
            "prompt": self.prompt,
            "all_lines": list(self.all_lines),
            "full_prompt": self.full_prompt,
            "status": self.status,
        }


def context_lines(
    postures: Iterable[str],
    grounds: Iterable[str],
    reprompts: Iterable[str],
    unmet: Iterable[str],
    deliveries: Iterable[BackgroundResult],
    tools: Iterable[str],
) -> list[str]:
    """Every instruction line for a turn, before repeats are dropped."""
    lines = [p for p in postures if p]
    lines += [g for g in grounds if g]
    lines += [r for r in reprompts if r]
    unmet = list(unmet)
    if unmet:
        lines.append(UNMET_PREFIX + ", ".join(unmet) + ".")
    # A silent result is handed over with the others, but the model is not told about it.
    lines += [delivery_line(d) for d in deliveries if d.scheduling is not Scheduling.SILENT]
    tools = list(tools)
    lines.append("Tools you may call now: " + (", ".join(tools) if tools else "none") + ".")
    return list(dict.fromkeys(lines))


def build_context(
    turn: Turn,
    briefs: Iterable[Brief],
    tools: Iterable[str],
    ask: Callable[[int, str], str | None],
    deliveries: tuple[BackgroundResult, ...],
    said: frozenset[str],
    conclude: Callable[[Handover, bool], None],
) -> TurnContext:
    """The context for ``turn`` from the flows' ``briefs`` (in order), the conversation's
    ``tools``, the ``deliveries`` taken from the inbox and the lines already ``said``.

    A tool is refused by the first flow that refuses it: from its brief when it was asked
    about the tool, else ``ask(i, tool)`` (flow ``i``'s reason, or None). The context is pending
    until ``conclude(handover, confirmed)`` is called through it.
    """
    briefs = list(briefs)
    known = dict.fromkeys(tools)
    for brief in briefs:
        known.update(dict.fromkeys(brief.tools))
    refused: dict[str, str] = {}
    for tool in known:
        for i, brief in enumerate(briefs):
            reason = brief.refused.get(tool) if tool in brief.tools else ask(i, tool)
            if reason is not None:
                refused[tool] = reason
                break
    allowed = [t for t in known if t not in refused]
    postures = [p for b in briefs for p in b.postures]
    grounds = [g for b in briefs for g in b.grounds]
    reprompts = [r for b in briefs for r in b.reprompts]
    unmet = [u for b in briefs for u in b.unmet]
    markers = tuple(b.told for b in briefs if b.told is not None)
    every = tuple(context_lines(postures, grounds, reprompts, unmet, deliveries, allowed))
    # A new result is news even when its text matches last turn's (a re-poll's answer).
    news = {delivery_line(d) for d in deliveries}
    lines = tuple(line for line in every if line in news or line not in said)
    timing = None
    for brief in briefs:
        if brief.timing is not None:  # the most cautious setting of each wins
            timing = brief.timing if timing is None else timing.merge(brief.timing)
    return TurnContext(
        turn,
        tuple(postures),
        tuple(grounds),
        tuple(reprompts),
        tuple(unmet),
        deliveries,
        tuple(allowed),
        refused,
        timing.model_dump(mode="json", exclude_none=True) if timing is not None else None,
        every,
        lines,
        Handover(every, deliveries, markers, conclude),
    )


def end_turn(state: State) -> int:
    """Clear the ``turn:`` and ``temp:`` scopes of ``state`` in one batch (source
    ``"system"``); returns how many keys. A conversation does this at the end of every turn."""
    return state.clear_prefix(TURN_SCOPES, source="system")


def publish_timing(state: State, value: dict[str, Any] | None) -> None:
    """Write the merged voice timing ``value`` at :data:`VOICE_TIMING_KEY`, or remove the key
    when no speaking step has any timing (``None``)."""
    if value is None:
        if VOICE_TIMING_KEY in state:
            state.remove(VOICE_TIMING_KEY, source="session", writer="voice_timing")
    elif state.get(VOICE_TIMING_KEY) != value:
        state.set(VOICE_TIMING_KEY, value, source="session", writer="voice_timing")


def roll_back_turn(state: State, before: int | None) -> bool:
    """Put ``session:turn`` back to ``before`` (a turn not taken); False when the State
    refused (a closed store: the turn is still not taken in memory)."""
    try:
        if before is None:
            state.remove("session:turn", None, source="session", writer="turn")
        else:
            state.set("session:turn", before, source="session", writer="turn")
    except Exception as exc:
        log.error("slateflow conversation: could not roll back session:turn: %s", exc)
        return False
    return True


DEFAULT_HOLD = 2.0
"""Seconds a hold waits, after an interruption, for the caller's words (``hold_for``)."""


def check_hold(hold_for: object) -> None:
    """Refuse a ``hold_for`` that is not a finite number of seconds > 0."""
    if (
        isinstance(hold_for, bool)
        or not isinstance(hold_for, int | float)
        or not 0 < hold_for < float("inf")
    ):
        raise ValueError(f"hold_for must be a number of seconds > 0, got {hold_for!r}")


def check_options(
    redact: object,
    on_delivery: object,
    on_waiting: object,
    handover: object,
    max_transcript: object,
    max_waiting: object,
) -> None:
    """Refuse bad options of a conversation with a message naming the option."""
    if redact is not None and not callable(redact):
        raise TypeError(f"redact must be a callable taking the text, or None, got {redact!r}")
    for name, fn in (("on_delivery", on_delivery), ("on_waiting", on_waiting)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a callable or None, got {fn!r}")
    if handover not in ("auto", "explicit", "manual"):
        raise ValueError(f"handover must be 'auto', 'explicit' or 'manual', got {handover!r}")
    for name, limit in (("max_transcript", max_transcript), ("max_waiting", max_waiting)):
        if type(limit) is not int or limit < 1:
            raise ValueError(f"{name} must be a positive int, got {limit!r}")
